"""Input checked against the models of ``cpsim.schema``: a pydantic ValidationError turned into one
``ConfigError`` line naming the field and the rule (unknown keys with a "did you mean", bounds with why).
"""

from __future__ import annotations

import difflib
import functools
import types
import typing
from typing import Any, Iterable

from pydantic import BaseModel, TypeAdapter, ValidationError

from cpsim.errors import ConfigError
from cpsim.schema import WHY, ScenarioModel


_UNIONS = (typing.Union, types.UnionType)

def parse(model: type[BaseModel], data: Any, root: str, source: str | None = None, cli: bool = False):
    """``model.model_validate(data)``, a ValidationError turned into one ConfigError line."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise config_error(e, model, root, source, cli) from None


def config_error(e: ValidationError, model: type[BaseModel], root: str, source: str | None = None,
                 cli: bool = False) -> ConfigError:
    """The first problem as ``field: rule`` (unknown keys first: they usually explain the rest).

    Alternatives of one union (``"builtin"`` or a SPEC string or a table) are reported together.
    """
    errors = e.errors(include_url=False)
    errors.sort(key=lambda err: err["type"] != "extra_forbidden")
    grouped: dict[str, list[str]] = {}
    bounds: dict[str, list[str]] = {}
    for err in errors:
        parts, parent, here = _walk(model, err["loc"])
        if err["type"] == "extra_forbidden":
            parts = parts[:-1]
        label = _label(root, parts, cli)
        grouped.setdefault(label, []).append(_rule(err, parent, here, parts))
        if err["type"] in _BOUNDS:
            bounds.setdefault(label, []).append(grouped[label][-1])
    label, rules = next(iter(grouped.items()))
    # A value of the right type out of range: only that alternative's bound is news to the user.
    rules = list(dict.fromkeys(bounds.get(label) or rules))
    if len(rules) == 1 or rules[0].startswith("unknown key"):
        rule = rules[0]
    else:  # one value, several union alternatives
        alts = [r.split(", got ")[0].removeprefix("must be ") for r in rules]
        got = rules[0].split(", got ", 1)[1] if ", got " in rules[0] else ""
        rule = "must be " + " or ".join(alts) + (f", got {got}" if got else "")
    # A label above this one is another alternative of the same union (an int where a list was given).
    more = len([other for other in grouped if not label.startswith(other)])
    if more:
        rule += f" (and {more} more problem{'s' if more > 1 else ''})"
    if source:
        rule += f" (in {source})"
    return ConfigError(label or root or "input", rule)


_BOUNDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short", "too_long",
           "string_too_short", "string_too_long", "string_pattern_mismatch")


def _label(root: str, parts: list[str], cli: bool) -> str:
    if cli:
        return "--" + parts[0].replace("_", "-") if parts else "options"
    text = root
    for p in parts:
        text += p if p.startswith("[") else (f".{p}" if text else p)
    return text


def _unwrap(t: Any) -> Any:
    """Strip Annotated and Optional: the type a value at this place must have."""
    while True:
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            t = typing.get_args(t)[0]
        elif origin in _UNIONS:
            args = [a for a in typing.get_args(t) if a is not type(None)]
            if len(args) != 1:
                return t
            t = args[0]
        else:
            return t


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _field(model: type[BaseModel], key: str) -> str | None:
    for name, f in model.model_fields.items():
        if key in (name, f.alias):
            return name
    return None


def _walk(model: type[BaseModel], loc: Iterable) -> tuple[list[str], Any, Any]:
    """(printable path, the model holding the last key, the type at the end) of a pydantic ``loc``.

    Union tags that pydantic puts in ``loc`` (``str``, ``KernelRecordModel``) are dropped from the path.
    """
    t: Any = model
    parent: Any = None
    parts: list[str] = []
    for p in loc:
        t = _unwrap(t)
        origin = typing.get_origin(t)
        if _is_model(t) and isinstance(p, str):
            parent = t
            name = _field(t, p)
            parts.append(p)
            t = t.model_fields[name].annotation if name else None
        elif origin is list and isinstance(p, int):
            parts.append(f"[{p}]")
            t = typing.get_args(t)[0]
        elif origin is dict:
            parts.append(str(p))
            t = typing.get_args(t)[1]
        elif origin in _UNIONS:
            members = [a for a in typing.get_args(t) if _is_model(_unwrap(a)) and _unwrap(a).__name__ == p]
            if not members and isinstance(p, str) and p.split("[")[0] in ("list", "dict"):  # e.g. "list[int]"
                members = [a for a in typing.get_args(t)
                           if getattr(typing.get_origin(_unwrap(a)), "__name__", "") == p.split("[")[0]]
            t = members[0] if members else None
        # else: a tag on a leaf (e.g. a union member's name): not part of the user's path
    return parts, parent, _unwrap(t) if t is not None else None


def _show(value: Any) -> str:
    """A value as the user wrote it in JSON / TOML terms, short."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"{value[:60]!r} (a string)"
    if isinstance(value, float):
        return f"{value!r} (a float)"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return repr(value)[:60]


def _nested_keys(model: Any) -> dict[str, str]:
    """{key: "field.key"} for the keys of the model's nested (non-list) models."""
    out: dict[str, str] = {}
    for name, f in (model.model_fields.items() if _is_model(model) else ()):
        t = _unwrap(f.annotation)
        if _is_model(t):
            out.update({g.alias or k: f"{name}.{g.alias or k}" for k, g in t.model_fields.items()})
    return out


def _rule(err: dict, parent: Any, here: Any, parts: list[str]) -> str:
    kind, msg, value = err["type"], err["msg"], err.get("input")
    field = next((p for p in reversed(parts) if not p.startswith("[")), "")
    if kind == "extra_forbidden":
        key = str(err["loc"][-1])
        allowed = [f.alias or n for n, f in parent.model_fields.items()] if _is_model(parent) else []
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        if not close:  # a key one level too high, e.g. "interleave" beside "cp" instead of inside it
            nested = _nested_keys(parent)
            close = [nested[k] for k in difflib.get_close_matches(key, list(nested), n=1, cutoff=0.75)]
        hint = f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(allowed)}"
        return f"unknown key {key!r}; {hint}"
    if kind == "missing":
        return "is required"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be an object (a JSON object / TOML table), got {_show(value)}"
    if kind == "list_type":
        return f"must be a list, got {_show(value)}"
    if kind == "literal_error":
        choices = [str(a) for a in typing.get_args(here)] if typing.get_origin(here) is typing.Literal else []
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6) if isinstance(value, str) else []
        text = f"must be one of {', '.join(choices)}" if choices else msg.replace("Input should be", "must be")
        return text + f", got {_show(value)}" + (f"; did you mean {close[0]!r}?" if close else "")
    for head in ("Input should", "String should", "List should", "Value should", "Dictionary should"):
        if msg.startswith(head):
            msg = "must" + msg[len(head):]
            break
    msg = msg.replace(" after validation", "")
    if kind in ("less_than_equal", "less_than") and field in WHY:
        return f"{msg}, got {value!r}: {WHY[field]}"
    if kind == "finite_number":
        return f"{msg}, got {value!r}"
    if kind in ("too_short", "too_long"):
        return msg
    return f"{msg}, got {_show(value)}"


@functools.lru_cache(maxsize=None)
def _adapter(kind: Any) -> TypeAdapter:
    return TypeAdapter(kind)


def parse_list(kind: Any, value: Any, label: str, source: str | None = None, entry: str | None = None) -> Any:
    """``value`` checked against a list type of ``cpsim.schema`` (``ARRAY_1D``, ``ARRAY_2D``, ``FLAGS``);
    the first bad entry named as ``label[i][j]``; ``entry`` words the rule for a bad entry ("true/false or 0/1")."""
    try:
        return _adapter(kind).validate_python(value)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        loc = [p for p in errors[0]["loc"] if isinstance(p, int)]
        same = [err for err in errors if [p for p in err["loc"] if isinstance(p, int)] == loc]
        rules = list(dict.fromkeys(_rule(err, None, None, []) for err in same))
        if entry is not None and loc and errors[0]["type"] != "list_type":
            rules = [f"must be {entry}, got {_show(errors[0].get('input'))}"]
        elif len(rules) > 1:  # one entry, several union alternatives
            got = rules[0].split(", got ", 1)[1] if ", got " in rules[0] else ""
            rules = ["must be " + " or ".join(r.split(", got ")[0].removeprefix("must be ") for r in rules)
                     + (f", got {got}" if got else "")]
        where = label + "".join(f"[{i}]" for i in loc)
        raise ConfigError(where, rules[0] + (f" (in {source})" if source else "")) from None


def scenario_data(d: Any, source: str | None = None) -> dict[str, Any]:
    """A scenario dict checked against the schema, with defaults filled in (``Scenario.from_dict`` input)."""
    return parse(ScenarioModel, d, "scenario", source).model_dump()

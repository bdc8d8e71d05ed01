"""One door for input: files and CLI values are checked against ``cpsim.schema`` before any work starts.

Every refusal is a ``ConfigError`` (exit 2, one line, no traceback) that names the
field, the rule and, for an unknown key, the closest allowed one. Output paths are
probed before the run so a long check is never computed and then lost; writes at
the end are isolated so one failing output does not take the others with it.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable

from pydantic import BaseModel, TypeAdapter, ValidationError

from cpsim import schema
from cpsim.errors import ConfigError

_UNIONS = (typing.Union, types.UnionType)
MAX_FILE_BYTES = 64 << 20   # no scenario or repro file comes near this; refuse to slurp a disk image
OUTPUT_OPTIONS = ("json", "html", "junit", "dump")


# ---- pydantic errors -> one ConfigError line -------------------------------------------

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
    if kind in ("less_than_equal", "less_than") and field in schema.WHY:
        return f"{msg}, got {value!r}: {schema.WHY[field]}"
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


# ---- reading files ---------------------------------------------------------------------

class _Duplicate(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise _Duplicate(k)
        seen[k] = v
    return seen


def _first_nonfinite(data: Any, where: str) -> str | None:
    if isinstance(data, float) and not math.isfinite(data):
        return where
    if isinstance(data, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in data.items())
    elif isinstance(data, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(data))
    else:
        return None
    for w, v in items:
        found = _first_nonfinite(v, w)
        if found is not None:
            return found
    return None


def read_data(path: str | Path, what: str = "scenario", noun: str | None = None) -> dict:
    """A JSON / TOML file as a dict: refused when it is not a readable text file holding one object.

    Any other suffix than ``.toml`` is read as JSON. NaN / inf (which Python's JSON and
    TOML readers both accept) are refused wherever they appear, as are duplicate JSON keys.
    ``what`` names the option in errors, ``noun`` the kind of file (default: ``what``).
    """
    noun = noun or what
    p = Path(path)
    if not p.exists():
        raise ConfigError(what, f"file {p} does not exist")
    if p.is_dir():
        raise ConfigError(what, f"{p} is a directory, not a file")
    if not p.is_file():
        raise ConfigError(what, f"{p} is not a regular file")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ConfigError(what, f"{p} is {size} bytes; {noun} files are far below {MAX_FILE_BYTES >> 20} MiB")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(what, f"cannot read {p}: {e.strerror or e}") from None
    kind = "TOML" if p.suffix == ".toml" else "JSON"
    try:
        if b"\0" in raw:
            raise UnicodeDecodeError("utf-8", raw, raw.index(b"\0"), raw.index(b"\0") + 1, "NUL byte")
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(what, f"{p} is not a text file (binary data); expected {kind}") from None
    try:
        data = tomllib.loads(text) if kind == "TOML" else json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(what, f"{p} is not valid {kind}: {e}") from None
    except _Duplicate as e:
        raise ConfigError(what, f"{p}: key {e.args[0]!r} appears twice in one object") from None
    except RecursionError:
        raise ConfigError(what, f"{p} nests too deeply to be a {noun} file") from None
    if not isinstance(data, dict):
        raise ConfigError(what, f"{p} must hold one {kind} object of {noun} fields, got {_show(data)}")
    bad = _first_nonfinite(data, "")
    if bad is not None:
        raise ConfigError(bad, f"NaN and infinity are not allowed; use a finite number (in {p})")
    return data


def scenario_data(d: Any, source: str | None = None) -> dict[str, Any]:
    """A scenario dict checked against the schema, with defaults filled in (``Scenario.from_dict`` input)."""
    return parse(schema.ScenarioModel, d, "scenario", source).model_dump()


def load_scenario(path: str | Path):
    """A scenario file, or the scenario a repro file wraps (``{"scenario": {...}, "knobs": ...}``)."""
    from cpsim import scenario as sc

    data = read_data(path, "scenario")
    if "scenario" in data and "groups" not in data:
        m = parse(schema.ReproModel, data, "repro", str(path))
        return sc.Scenario.from_dict(m.scenario.model_dump())
    return sc.Scenario.from_dict(scenario_data(data, str(path)))


def load_repro(path: str | Path, accept_edited: bool = False):
    """A repro file for ``replay``; refused when its scenario no longer has the recorded fingerprint."""
    from cpsim import fuzz as fz
    from cpsim import scenario as sc
    from cpsim.paths import Knobs

    data = read_data(path, "FILE", "repro")
    if "schema" not in data:
        raise ConfigError("FILE", f"{path} is not a cpsim repro file (no \"schema\": {schema.REPRO_SCHEMA!r})")
    m = parse(schema.ReproModel, data, "repro", str(path))
    s = sc.validate(sc.Scenario.from_dict(m.scenario.model_dump()))
    if not accept_edited:
        if m.fingerprint is None:
            raise ConfigError("repro.fingerprint", f"is required: replay checks the scenario against it "
                                                   f"(--accept-edited replays without the check) (in {path})")
        if s.fingerprint() != m.fingerprint:
            raise ConfigError("repro.scenario", f"was edited: its fingerprint is {s.fingerprint()}, the repro "
                                                f"recorded {m.fingerprint}; pass --accept-edited to replay the "
                                                f"edited scenario (in {path})")
    kernels = {p: (v.model_dump() if isinstance(v, BaseModel) else v) for p, v in m.kernels.items()}
    return fz.Repro(s, list(m.paths or fz.DEFAULT_PATHS), Knobs(**m.knobs.model_dump()), m.inject,
                    m.violation.model_dump(), kernels)


def load_sweep_config(path: str | Path) -> dict[str, Any]:
    """``sweep --config FILE``: the matrix keys only, typed."""
    data = read_data(path, "--config", "sweep config")
    return parse(schema.SweepConfigModel, data, "config", str(path)).model_dump(exclude_none=True)


# ---- CLI values and output paths ----------------------------------------------------------

def check_args(args) -> None:
    """Bounds on the shared options, then every output path: all before any work starts."""
    values = {k: v for k, v in vars(args).items() if k in schema.CliValues.model_fields and v is not None}
    parse(schema.CliValues, values, "", cli=True)
    check_outputs(output_paths(args))


def output_paths(args) -> dict[str, str]:
    """{flag: path} of the files this command will write."""
    out = {f"--{k}": getattr(args, k) for k in OUTPUT_OPTIONS if isinstance(getattr(args, k, None), str)}
    if getattr(args, "command", None) == "draw" and isinstance(getattr(args, "out", None), str):
        out["--out"] = args.out
    return out


def check_outputs(outputs: dict[str, str]) -> None:
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        check_writable(flag, path)
        key = Path(path).resolve()
        if key in seen:
            raise ConfigError(flag, f"{path} is also given to {seen[key]}; one file cannot hold both")
        seen[key] = flag


def check_writable(flag: str, path: str) -> None:
    """Refuse a path that cannot be written: a directory, a missing parent, no permission.

    Probes by opening (an existing file in append mode, which changes nothing; a new
    name through a uniquely named scratch file) because permission bits lie to root.
    """
    if not path.strip():
        raise ConfigError(flag, "is empty; give a file name")
    p = Path(path)
    if p.is_dir():
        raise ConfigError(flag, f"{p} is a directory; give a file name")
    parent = p.parent
    if not parent.exists():
        raise ConfigError(flag, f"cannot write {p}: directory {parent} does not exist")
    if not parent.is_dir():
        raise ConfigError(flag, f"cannot write {p}: {parent} is not a directory")
    try:
        if p.exists():
            with open(p, "ab"):
                pass
        else:
            probe = parent / f".{p.name}.{os.getpid()}.cpsim-probe"
            os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            probe.unlink()
    except OSError as e:
        raise ConfigError(flag, f"cannot write {p}: {e.strerror or e}") from None


def write_outputs(writers: list[tuple[str, str | None, Callable[[], Any]]]) -> None:
    """Call every writer whose path is set, even when an earlier one fails; then report the failures.

    A write can still fail after the precheck (disk full, a directory removed during the
    run); the outputs that can be written are, and the command exits 2 naming the rest.
    """
    failed, written = [], []
    for flag, path, write in writers:
        if not path:
            continue
        try:
            write()
            written.append(flag)
        except OSError as e:
            failed.append((flag, f"cannot write {path}: {e.strerror or e}"))
    if failed:
        rest = f" ({', '.join(written)} written)" if written else ""
        raise ConfigError(", ".join(f for f, _ in failed), "; ".join(why for _, why in failed) + rest)


# ---- CP world size -----------------------------------------------------------------------

def check_world(s, allow_large: bool) -> None:
    """The virtual world runs every rank in turn in one process: large worlds need asking for."""
    if s.cp.world > schema.LARGE_WORLD and not allow_large:
        raise ConfigError("cp", f"CP world size {s.cp.world} (DCP {s.cp.dcp} x PCP {s.cp.pcp}) is above "
                                f"{schema.LARGE_WORLD}: the virtual world runs every rank in turn, which takes "
                                f"minutes; pass --allow-large to run it anyway")

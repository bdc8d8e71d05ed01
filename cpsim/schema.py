"""The shape of every file and value cpsim reads, as pydantic models.

The dataclasses in ``cpsim.scenario`` stay the runtime objects (frozen, hashed into
the fingerprint); these models only guard the door, so that a misspelt key, a bool
where an int belongs or a size no machine can hold is refused with its field named
instead of being silently read as something else. Leaves are strict (``StrictInt``
refuses ``true`` and ``1.0``, ``StrictBool`` refuses ``"no"``); containers stay lax
so a ``to_dict()`` with tuples validates like the JSON it is written as.

When a field is added to a dataclass, add it here too: ``tests/test_bad_input.py``
compares the two field lists so a forgotten one fails loudly. ``parse`` turns a model's
ValidationError into one ``ConfigError`` line naming the field and the rule.
"""

from __future__ import annotations

import difflib
import functools
import types
import typing
from typing import Annotated, Any, Iterable, Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, TypeAdapter,
                      ValidationError)

from cpsim.errors import ConfigError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_CP = 1024                 # per CP dimension; the virtual world also asks for --allow-large above LARGE_WORLD
LARGE_WORLD = 64              # CP world sizes above this run only with --allow-large (virtual world)
MAX_TOKENS = 2**24            # positions / batched tokens: cpsim allocates arrays of this length
MAX_BLOCK = 2**24             # tokens per block
MAX_REQS = 2**16
MAX_SPEC = 64
MAX_TIMEOUT_S = 7 * 24 * 3600.0
REPRO_SCHEMA = "cpsim-repro/1"   # same string as cpsim.fuzz.REPRO_SCHEMA (kept here so loading needs no Hypothesis)

GROUP_KINDS = ("attention", "sliding_window", "mamba")
PATH_NAMES = ("v1", "v1-fused", "v1-torch", "v2")
KERNEL_DESIGNS = ("per-request", "tile")

# Why each bound exists; appended to "must be <= N" so the user sees the reason.
WHY = {
    "dcp": f"CP sizes above {MAX_CP} are beyond any deployment",
    "pcp": f"CP sizes above {MAX_CP} are beyond any deployment",
    "interleave": "an interleave larger than any block size cannot divide one",
    "block_size": f"no runtime uses blocks of more than {MAX_BLOCK} tokens",
    "kernel_block_size": f"no runtime uses blocks of more than {MAX_BLOCK} tokens",
    "num_blocks": "block ids are int32 in the block tables",
    "max_model_len": f"cpsim allocates per-position arrays; {MAX_TOKENS} tokens is above every released model's context",
    "max_num_batched_tokens": f"the slot buffers hold this many int64 entries per group and rank; "
                              f"{MAX_TOKENS} is above any scheduler budget",
    "max_num_reqs": f"block tables have a row per request; {MAX_REQS} is above any scheduler's limit",
    "num_speculative_tokens": f"no speculative decoder drafts more than {MAX_SPEC} tokens",
    "context_len": f"positions are bounded by {MAX_TOKENS} (see limits.max_model_len)",
    "num_tokens": f"positions are bounded by {MAX_TOKENS} (see limits.max_model_len)",
    "num_tokens_padded": f"the slot buffer is bounded by {MAX_TOKENS} tokens",
    "replay_start": f"positions are bounded by {MAX_TOKENS} (see limits.max_model_len)",
    "prefix_replay_tokens": f"positions are bounded by {MAX_TOKENS} (see limits.max_model_len)",
    "seed": "seeds are stored as int64",
    "timeout": "a bound of more than a week is no bound",
}


class Strict(BaseModel):
    """Unknown keys are errors; NaN / inf never pass."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


# ---- scenario files (cpsim.scenario) ---------------------------------------------------

class CPConfigModel(Strict):
    dcp: Annotated[StrictInt, Field(ge=1, le=MAX_CP)] = 1
    pcp: Annotated[StrictInt, Field(ge=1, le=MAX_CP)] = 1
    interleave: Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)] = 1


class KVGroupModel(Strict):
    name: Annotated[StrictStr, Field(min_length=1, max_length=200)]
    kind: Literal[GROUP_KINDS] = "attention"
    block_size: Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)] = 128
    kernel_block_size: Annotated[StrictInt, Field(ge=0, le=MAX_BLOCK)] = 0
    cp_sharded: StrictBool = True
    num_blocks: Annotated[StrictInt, Field(ge=2, le=INT32_MAX)] = 4096
    cp_size: Annotated[StrictInt, Field(ge=0, le=MAX_CP)] = 0   # group CP size g; 0 = the world size
    prefix_cacheable: StrictBool = True                          # false: replayed positions keep real slots
    prefix_replay_tokens: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)] = 0  # replay window it asks for
    row_blocks: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)] = 0  # a tail group's blocks per row; 0 = all
    compress_ratio: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] = 1  # own positions count every r-th token


class LimitsModel(Strict):
    max_model_len: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] = 8192
    max_num_reqs: Annotated[StrictInt, Field(ge=1, le=MAX_REQS)] = 16
    max_num_batched_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] = 2048
    num_speculative_tokens: Annotated[StrictInt, Field(ge=0, le=MAX_SPEC)] = 0


class RequestModel(Strict):
    context_len: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]
    num_tokens: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]
    kind: Annotated[StrictStr, Field(max_length=200)] = ""
    padded_drafts: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)] = 0
    replay_start: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)] = 0   # prefix-cache replay; 0 = none


class BatchModel(Strict):
    # At least one request: an empty batch checks nothing and would read as a pass.
    requests: Annotated[list[RequestModel], Field(min_length=1, max_length=MAX_REQS)]
    idx_mapping: list[Annotated[StrictInt, Field(ge=-1, le=MAX_REQS)]] = []
    num_tokens_padded: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)] = 0
    is_padding: list[Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]] = []


class ScenarioModel(Strict):
    name: Annotated[StrictStr, Field(min_length=1, max_length=200)] = "custom"
    cp: CPConfigModel = CPConfigModel()
    groups: Annotated[list[KVGroupModel], Field(min_length=1, max_length=64)]
    limits: LimitsModel = LimitsModel()
    batch: BatchModel           # required: a misspelt "batch" must not mean "no requests"
    seed: Annotated[StrictInt, Field(ge=0, le=INT64_MAX)] = 0
    allow_invalid: StrictBool = False


# ---- repro files (written by cpsim.fuzz, read by replay and draw --repro) --------------

class HostSizingModel(Strict):
    host: Literal["v1", "v2"]
    table_widths: Annotated[list[Annotated[StrictInt, Field(ge=1, le=INT32_MAX)]], Field(max_length=64)]
    slot_buffer_len: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]
    source: StrictStr = ""


class KnobsModel(Strict):
    kernel_fault: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)] = 0
    virtual_from_kernel_block: StrictBool = False
    unsharded_width_per_cp: StrictBool = False
    sharded_width_undivided: StrictBool = False
    buffer_size: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)] = 0
    draft_overwrite: StrictBool = False
    kernel_design: Literal[KERNEL_DESIGNS] = "per-request"
    host_sizing: Annotated[list[HostSizingModel], Field(max_length=2)] = []


class ReplayKernelRecordModel(Strict):
    spec: Annotated[StrictStr, Field(min_length=1)]
    abi: StrictStr = "auto"
    shim_vllm: StrictBool = False


class KernelRecordModel(Strict):
    spec: Annotated[StrictStr, Field(min_length=1)]   # "builtin" when only the replay kernel is the user's
    abi: StrictStr = "auto"
    v2_launch: StrictStr = "split"
    shim_vllm: StrictBool = False
    replay: ReplayKernelRecordModel | None = None     # --kernel-replay


class FailureModel(Strict):
    invariant: StrictStr
    path: StrictStr
    count: Annotated[StrictInt, Field(ge=0)]
    messages: list[StrictStr] = []


class ViolationModel(Strict):
    invariants: list[StrictStr] = []
    failures: list[FailureModel] = []
    error: StrictStr | None = None


class ReproModel(Strict):
    """A repro file. ``replay`` needs schema, fingerprint and scenario; ``draw --repro`` only scenario."""

    schema_: Annotated[Literal[REPRO_SCHEMA] | None, Field(alias="schema")] = None
    cpsim_version: StrictStr | None = None
    fingerprint: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{16}$")] | None = None
    scenario: ScenarioModel
    paths: Annotated[list[Literal[PATH_NAMES]], Field(min_length=1)] | None = None
    kernels: dict[Literal[PATH_NAMES], Union[Literal["builtin"], StrictStr, KernelRecordModel, None]] = {}
    inject: StrictStr | None = None
    knobs: KnobsModel = KnobsModel()
    violation: ViolationModel = ViolationModel()
    size: dict[StrictStr, StrictInt] = {}
    fuzz: dict[StrictStr, Any] = {}           # how the search ran (seed, examples, ...): informative only
    inject_rank: Annotated[StrictInt, Field(ge=0, le=MAX_CP * MAX_CP)] | None = None
    profile: StrictStr | None = None          # the release profile that judged (cpsim.check.profiles)
    sizing: StrictStr | None = None           # the --sizing SPEC it was found with (cpsim.run.sizing)

    model_config = ConfigDict(populate_by_name=True)


# ---- sweep --config TOML ------------------------------------------------------------------

_Items = Union[StrictStr, StrictInt, list[Union[StrictStr, StrictInt]]]


class SweepConfigModel(Strict):
    presets: StrictStr | list[StrictStr] | None = None
    cp: _Items | None = None
    interleaves: _Items | None = None
    paths: StrictStr | list[StrictStr] | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=INT64_MAX)] | None = None


# ---- CLI values (after argparse has turned them into ints / floats) ----------------------

class CliValues(BaseModel):
    """Bounds on the options shared by the sub-commands; options a command lacks stay None."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    seed: Annotated[StrictInt, Field(ge=0, le=INT64_MAX)] | None = None
    dcp: Annotated[StrictInt, Field(ge=1, le=MAX_CP)] | None = None
    pcp: Annotated[StrictInt, Field(ge=1, le=MAX_CP)] | None = None
    interleave: Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)] | None = None
    timeout: Annotated[StrictFloat, Field(gt=0, le=MAX_TIMEOUT_S)] | None = None
    inject_on_rank: Annotated[StrictInt, Field(ge=0, le=MAX_CP * MAX_CP)] | None = None
    jobs: Annotated[StrictInt, Field(ge=0, le=1024)] | None = None


# ---- capture files and explicit batches (cpsim.capture) ----------------------------------

EXPLICIT_FORMAT = "cpsim-explicit"   # same string as cpsim.capture.batch.FORMAT
CAPTURE_FORMAT = "cpsim-capture"     # same string as cpsim.capture.recorder.FORMAT
MAX_RANKS = MAX_CP * MAX_CP
_Int64 = Annotated[StrictInt, Field(ge=-(2**63), le=INT64_MAX)]
_Count = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]
_Flag = Union[StrictBool, Annotated[StrictInt, Field(ge=0, le=1)]]   # is_padding: true/false or 0/1
_Name = Annotated[StrictStr, Field(min_length=1, max_length=200)]


class ExplicitGroupModel(KVGroupModel):
    entry_size: Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)] | None = None  # slots per table entry; None: b


class ExplicitRankModel(Strict):
    num_tokens_padded: _Count | None = None    # None: the scheduled token count


class ExplicitMetaModel(Strict):
    """An explicit batch's ``meta.json`` (``.npz``); its arrays are checked by ``cpsim.capture.batch``."""

    format: Literal[EXPLICIT_FORMAT]
    version: Literal[1]
    path: Literal["v1", "v2"] = "v2"
    cp: CPConfigModel = CPConfigModel()
    limits: LimitsModel = LimitsModel()
    groups: Annotated[list[ExplicitGroupModel], Field(min_length=1, max_length=64)]
    ranks: Annotated[list[ExplicitRankModel], Field(max_length=MAX_RANKS)] | None = None
    label: dict[StrictStr, Any] = {}         # where the step came from: informative only


class ExplicitJsonModel(ExplicitMetaModel):
    """The one-file JSON form: ``meta.json`` plus the arrays inline (names and shapes in ``cpsim.capture.batch``)."""

    arrays: dict[StrictStr, list[Any]]


# Array element types of the JSON form, by number of dimensions (flags: is_padding).
ARRAY_1D = list[_Int64]
ARRAY_2D = list[list[_Int64]]
FLAGS = list[_Flag]


class CaptureMetaModel(Strict):
    """What the kernel arguments do not carry (``CPSIM_CAPTURE_META`` / ``capture(meta=...)``)."""

    max_model_len: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] | None = None
    max_num_batched_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] | None = None
    max_num_reqs: Annotated[StrictInt, Field(ge=1, le=MAX_REQS)] | None = None
    num_speculative_tokens: Annotated[StrictInt, Field(ge=0, le=MAX_SPEC)] | None = None
    num_blocks: Union[list[Annotated[StrictInt, Field(ge=2, le=INT32_MAX)]],
                      Annotated[StrictInt, Field(ge=2, le=INT32_MAX)]] | None = None   # per group, or for all
    group_names: Annotated[list[_Name], Field(max_length=64)] | None = None
    block_sizes: Annotated[list[Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)]], Field(max_length=64)] | None = None


class CapturePolicyModel(Strict):
    every: Annotated[StrictInt, Field(ge=1)] = 1
    first: Annotated[StrictInt, Field(ge=0)] = 0
    last: Annotated[StrictInt, Field(ge=0)] | None = None
    budget: Annotated[StrictInt, Field(ge=1)] = 1 << 30
    ranks: list[Annotated[StrictInt, Field(ge=0, le=MAX_RANKS)]] | None = None


class CaptureHeaderModel(Strict):
    """``capture.json`` at the top of each ``rank<R>.cpcap``."""

    format: Literal[CAPTURE_FORMAT]
    version: Literal[1]
    rank: Annotated[StrictInt, Field(ge=0, le=MAX_RANKS)]
    pid: StrictInt | None = None
    host: StrictStr | None = None
    created: StrictStr | None = None
    policy: CapturePolicyModel = CapturePolicyModel()
    meta: CaptureMetaModel = CaptureMetaModel()


class CaptureTruncatedModel(Strict):
    step: Annotated[StrictInt, Field(ge=0)]
    call: Annotated[StrictInt, Field(ge=0)] = 0
    budget: Annotated[StrictInt, Field(ge=0)] | None = None


class LaunchScalarsModel(BaseModel):
    """The scalar arguments of one recorded launch that replay reads; the kernel's others pass untouched."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, frozen=True)

    TOTAL_CP_WORLD_SIZE: Annotated[StrictInt, Field(ge=1, le=MAX_RANKS)] = 1
    TOTAL_CP_RANK: Annotated[StrictInt, Field(ge=0, le=MAX_RANKS)] = 0
    CP_KV_CACHE_INTERLEAVE_SIZE: Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)] = 1
    KV_CACHE_BLOCK_SIZE: Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)] | None = None
    block_size: Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)] | None = None
    IS_CIRCULAR: _Flag = False
    CP_SIZE: Annotated[StrictInt, Field(ge=1, le=MAX_RANKS)] = 1
    CP_INTERLEAVE: Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)] = 1
    cp_rank: Annotated[StrictInt, Field(ge=0, le=MAX_RANKS)] | None = None
    max_num_tokens: _Count | None = None
    num_tokens: _Count | None = None


class HostGroupModel(Strict):
    """One group of a recorded host-class call (cpsim.capture.hosts): the object's own attributes."""

    kind: Literal["attention", "mamba"]
    block_size: Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)]        # the physical (KV manager) block
    entry_size: Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)]        # slots per table entry (kernel block)
    cp_world: Annotated[StrictInt, Field(ge=1, le=MAX_RANKS)] = 1
    cp_rank: Annotated[StrictInt, Field(ge=0, le=MAX_RANKS)] = 0
    interleave: Annotated[StrictInt, Field(ge=1, le=MAX_BLOCK)] = 1
    sharded: StrictBool = True
    max_num_reqs: Annotated[StrictInt, Field(ge=1, le=MAX_REQS)]
    max_num_batched_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]


class HostCallModel(Strict):
    groups: Annotated[list[HostGroupModel], Field(min_length=1, max_length=64)]
    num_tokens_padded: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]


class LaunchModel(Strict):
    """``s<step>/c<call>/meta.json``: one recorded launch (or host-class call: ``host``)."""

    kernel: StrictStr
    family: Literal["v1", "v2", "v1-fused", "host-v1", "host-v2", "unknown"]
    host: HostCallModel | None = None
    params: list[StrictStr] = []
    grid: list[Annotated[StrictInt, Field(ge=0)]] = []
    scalars: LaunchScalarsModel = LaunchScalarsModel()
    dtypes: dict[StrictStr, StrictStr] = {}
    step: Annotated[StrictInt, Field(ge=0)] | None = None
    call: Annotated[StrictInt, Field(ge=0)] | None = None
    rank: Annotated[StrictInt, Field(ge=0, le=MAX_RANKS)] | None = None


# ---- pydantic errors -> one ConfigError line -------------------------------------------

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

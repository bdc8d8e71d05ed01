"""The shape of every file and value cpsim reads, as pydantic models.

The dataclasses in ``cpsim.scenario`` stay the runtime objects (frozen, hashed into
the fingerprint); these models only guard the door, so that a misspelt key, a bool
where an int belongs or a size no machine can hold is refused with its field named
instead of being silently read as something else. Leaves are strict (``StrictInt``
refuses ``true`` and ``1.0``, ``StrictBool`` refuses ``"no"``); containers stay lax
so a ``to_dict()`` with tuples validates like the JSON it is written as.

When a field is added to a dataclass, add it here too: ``tests/test_bad_input.py``
compares the two field lists so a forgotten one fails loudly. ``cpsim.parsing.parse`` turns a
model's ValidationError into one ``ConfigError`` line naming the field and the rule.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

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
SLOT_BUFFER_DTYPES = ("abi", "int32", "int64")
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
    slot_buffer_dtype: Literal[SLOT_BUFFER_DTYPES] = "abi"   # the slot buffer's dtype; "abi": the ABI's


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
    sizing: StrictStr | None = None           # the --sizing SPEC it was found with (cpsim.run.host_sizer)

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

"""The eleven catalogue entries of SPEC §5 and their smallest triggering scenarios.

Scenarios are kept tiny (one or a few requests, two CP ranks) so each entry runs
in seconds under the Triton interpreter. Faults that need huge values use a huge
*simulated* cache: the allocator only materialises the block ids it hands out.
"""

from __future__ import annotations

from cpsim import kernels
from cpsim.faults import Fault
from cpsim.paths import Knobs
from cpsim.scenario import Batch, CPConfig, KVGroup, Limits, Request, Scenario, validate

ALL = ("v1", "v1-fused", "v1-torch", "v2")
TRITON = ("v1", "v1-fused", "v2")
SHARDED = ("v1", "v1-torch", "v2")  # what only changes with CP > 1 (v1-fused is CP 1 only)


def _one(name: str, cp: CPConfig, groups: tuple[KVGroup, ...], limits: Limits, requests, padded: int = 0,
         seed: int = 0) -> Scenario:
    return validate(Scenario(f"bug:{name}", cp, groups, limits, Batch(tuple(requests), (), padded), seed=seed))


def _virtual_block() -> Scenario:
    # vLLM #51031 used B=128, b=64, DCP 4, I=128; the same shape at B=16, b=8, N=2, I=16.
    return _one("virtual-block-uses-kernel-block", CPConfig(dcp=2, interleave=16),
                (KVGroup("attn", "attention", 16, 8, num_blocks=8),),
                Limits(max_model_len=64, max_num_reqs=1, max_num_batched_tokens=32),
                [Request(0, 32, "prefill")])


def _mamba_sized() -> Scenario:
    return _one("mamba-sized-per-cp", CPConfig(dcp=2, interleave=1),
                (KVGroup("attn", "attention", 16, num_blocks=8),
                 KVGroup("mamba", "mamba", 16, cp_sharded=False, num_blocks=8)),
                Limits(max_model_len=64, max_num_reqs=1, max_num_batched_tokens=8),
                [Request(0, 4, "prefill")])


def _full_cp() -> Scenario:
    # The PR's example: CP 2, a replicated group of block size 4, positions 0..3.
    return _one("cp-applied-to-unsharded-groups", CPConfig(dcp=2, interleave=1),
                (KVGroup("attn", "attention", 4, num_blocks=8),
                 KVGroup("swa", "sliding_window", 4, cp_sharded=False, num_blocks=4)),
                Limits(max_model_len=64, max_num_reqs=1, max_num_batched_tokens=8),
                [Request(0, 4, "prefill")])


# vllm-ascend #14024: DCP 4, MTP 5, 12 requests, 80 batched tokens.
MTP_LIMITS = Limits(max_model_len=256, max_num_reqs=12, max_num_batched_tokens=80, num_speculative_tokens=5)
MTP_OLD_BUFFER = MTP_LIMITS.max_num_batched_tokens + 2 * MTP_LIMITS.max_num_reqs  # 104


def _old_mtp_buffer(s: Scenario) -> Knobs:
    """The pre-#14024 formula on any scenario: it over-provisions up to MTP 3 and falls short from MTP 4."""
    return Knobs(buffer_size=s.limits.max_num_batched_tokens + 2 * s.limits.max_num_reqs)


def _mtp() -> Scenario:
    # One MTP5 verify step: 12 requests x (1 + 5) tokens = 72; the draft input adds 12 x 4 = 48 -> 120 > 104.
    return _one("mtp-draft-capacity", CPConfig(dcp=4, interleave=1),
                (KVGroup("attn", "attention", 16, num_blocks=32),), MTP_LIMITS,
                [Request(10 * i + 3, 6, "spec") for i in range(12)])


def _width() -> Scenario:
    return _one("table-width-not-divided", CPConfig(dcp=2, interleave=1),
                (KVGroup("attn", "attention", 16, num_blocks=8),),
                Limits(max_model_len=64, max_num_reqs=1, max_num_batched_tokens=8),
                [Request(0, 4, "prefill")])


def _stale_tail() -> Scenario:
    # 5 real tokens padded to 8 for a graph: entries 5..7 belong to nobody.
    return _one("stale-tail", CPConfig(),
                (KVGroup("attn", "attention", 16, num_blocks=8),),
                Limits(max_model_len=64, max_num_reqs=1, max_num_batched_tokens=16),
                [Request(0, 5, "prefill")], padded=8)


def _fixed_window() -> Scenario:
    # One decode token at position 4096 * B: table index 4096, one past the fixed window.
    B = 16
    return _one("fixed-table-window", CPConfig(),
                (KVGroup("attn", "attention", B, num_blocks=4200),),
                Limits(max_model_len=4097 * B, max_num_reqs=1, max_num_batched_tokens=4),
                [Request(4096 * B, 1, "decode")])


def _fp32() -> Scenario:
    # 2^28 simulated blocks: an id above 2^24 is rounded to a multiple of 2^k in float32.
    return _one("fp32-block-gather", CPConfig(),
                (KVGroup("attn", "attention", 16, num_blocks=2**28),),
                Limits(max_model_len=64, max_num_reqs=1, max_num_batched_tokens=4),
                [Request(0, 1, "decode")])


def _int32() -> Scenario:
    # 2^26 blocks of 128 slots: any id >= 2^24 gives block * 128 >= 2^31.
    return _one("int32-slot-overflow", CPConfig(),
                (KVGroup("attn", "attention", 128, num_blocks=2**26),),
                Limits(max_model_len=256, max_num_reqs=1, max_num_batched_tokens=4),
                [Request(0, 1, "decode")])


def _draft() -> Scenario:
    # PCP 2 with 3 speculative tokens: two verify steps of 1 + 3 tokens, 2 draft look-ahead slots each.
    return _one("draft-overwrite", CPConfig(pcp=2, interleave=1),
                (KVGroup("attn", "attention", 16, num_blocks=8),),
                Limits(max_model_len=64, max_num_reqs=2, max_num_batched_tokens=8, num_speculative_tokens=3),
                [Request(4, 4, "spec"), Request(10, 4, "spec")])


def _short() -> Scenario:
    # 5 tokens < I = 16: rank 1 owns none of them.
    return _one("short-request-rank", CPConfig(dcp=2, interleave=16),
                (KVGroup("attn", "attention", 16, num_blocks=8),),
                Limits(max_model_len=64, max_num_reqs=1, max_num_batched_tokens=8),
                [Request(0, 5, "prefill-short")])


FAULTS: tuple[Fault, ...] = (
    Fault(
        "virtual-block-uses-kernel-block",
        "virtual block from kernel block b, not physical B (BPK > 1)",
        "With hybrid blocks a physical KV block of B slots is addressed as B/b kernel blocks of b slots. "
        "Ownership and the rank-local offset must be computed over virtual blocks of B x N positions; "
        "the buggy path built them from b x N. Whenever the interleave I is larger than b, the owner "
        "(vo // I) % N collapses: rank 0 keeps every position, other ranks keep none, and the slots rank 0 "
        "writes run past its blocks. The model compiles and serves, only accuracy drops.",
        ("vllm-ascend #10442", "vLLM #51031 (v2)"),
        SHARDED,
        Knobs(virtual_from_kernel_block=True),
        _virtual_block,
        ("owner-rule", "dense-local", "matches-reference"),
    ),
    Fault(
        "mamba-sized-per-cp",
        "unsharded (mamba) table width divided by CP size",
        "Only CP-sharded attention KV is split over ranks; a mamba / state group keeps every token on "
        "every rank, so its block-table row must be as wide as without CP. Dividing its width by N like "
        "an attention group leaves rows N times too narrow: a long request's block ids spill into the "
        "next row or past the table, and the state kernel reads out of range.",
        ("vllm-ascend #9724", "vLLM #40996", "vLLM #50287"),
        SHARDED,
        Knobs(unsharded_width_per_cp=True),
        _mamba_sized,
        ("block-sizing",),
    ),
    Fault(
        "cp-applied-to-unsharded-groups",
        "v2 kernel applies the CP owner transform to every group",
        "The v2 kernel took CP_SIZE > 1 to mean that every group is sharded. Replicated groups (mamba, "
        "sliding window, local attention) hold all tokens on every rank, but under the transform each "
        "rank keeps only its interleaved share: (N-1)/N of their tokens become PAD and the survivors get "
        "the rank-local offset instead of p % B, i.e. wrong slots. Silent corruption of those layers.",
        ("vLLM #57260",),
        ("v2",),
        Knobs(kernel_fault=kernels.FAULT_FULL_CP),
        _full_cp,
        ("exactly-one-owner", "matches-reference"),
    ),
    Fault(
        "mtp-draft-capacity",
        "slot buffer sized max_num_batched_tokens + 2 x max_num_reqs",
        "With DCP and MTP the draft input appends num_speculative_tokens - 1 look-ahead positions per "
        "request after the scheduled tokens, so the slot buffer needs max_num_batched_tokens + "
        "(num_spec - 1) x max_num_reqs entries. The old size carried a leftover 2 x max_num_reqs reserve, "
        "which happens to match MTP 3 and hid the bug; at MTP 5 with 12 requests and 80 batched tokens "
        "the buffer holds 104 entries where up to 128 are written, and the CPU copy fails.",
        ("vllm-ascend #14024", "vllm-ascend #13710"),
        ALL,
        Knobs(buffer_size=MTP_OLD_BUFFER),
        _mtp,
        ("capacity",),
        "cpsim's paths write only the scheduled tokens, so nothing is dropped here; the capacity "
        "invariant compares the buffer with what the draft input needs (SPEC §3 formula).",
        knobs_fn=_old_mtp_buffer,
    ),
    Fault(
        "table-width-not-divided",
        "sharded group's table width not divided by DCP",
        "One spec class (UniformTypeKVCacheSpecs) forgot the DCP division of max_num_blocks_per_req, so "
        "the runner sized the table cdiv(max_model_len, B) wide while the attention metadata builders, "
        "using the per-layer spec, expected cdiv(max_model_len, B x DCP): 16384 vs 8192 columns and a "
        "shape error (or silent row truncation) at decode.",
        ("vLLM #50823", "vLLM #50825"),
        SHARDED,
        Knobs(sharded_width_undivided=True),
        _width,
        ("block-sizing",),
        "Modelled as the producer's width alone; the consumer that crashed upstream is the width the "
        "block-sizing invariant demands.",
    ),
    Fault(
        "stale-tail",
        "padding starts at the padded token count",
        "Under graph capture the token count passed to the kernel is padded. If the padding program "
        "starts at that padded count instead of at query_start_loc[num_reqs], the entries between the "
        "last real token and the padded count are written by nobody and keep slot ids from an earlier "
        "step; the padded tokens then write their garbage KV over real cache entries.",
        ("vllm-ascend #11774", "upstream vLLM v2 kernel (num_tokens argument)"),
        ALL,
        Knobs(kernel_fault=kernels.FAULT_STALE_TAIL),
        _stale_tail,
        ("padding",),
        "Buffers are poisoned before each launch, so the stale entries show as 'unwritten' rather than "
        "as real slot ids of an earlier step.",
    ),
    Fault(
        "fixed-table-window",
        "fixed 4096-entry block-table window",
        "An older Ascend v2 kernel loaded a fixed 4096-entry slice of the block-table row and gathered "
        "from it. Any table index >= 4096 (positions >= 4096 x B x N, e.g. 128K context at block 16) "
        "reads outside the window, and a row narrower than 4096 reads its neighbours: wrong slots.",
        ("vllm-ascend #7575", "vllm-ascend #13155", "vllm-ascend #15212"),
        TRITON,
        Knobs(kernel_fault=kernels.FAULT_FIXED_WINDOW),
        _fixed_window,
        ("matches-reference", "dense-local"),
        "cpsim's fixed window masks loads at the row stride and clamps the index to 4095, so it reads a "
        "wrong block of the same row instead of undefined memory.",
    ),
    Fault(
        "fp32-block-gather",
        "block ids gathered through float32",
        "The optimised v1 kernel staged the block-table window as float32 to use a gather, then cast back "
        "to int32. float32 holds integers exactly only up to 2^24, so with a cache of more than 16.7M "
        "blocks most ids come back rounded to a neighbouring block: KV goes to another request's slots.",
        ("vllm-ascend #13048",),
        TRITON,
        Knobs(kernel_fault=kernels.FAULT_FP32_GATHER),
        _fp32,
        ("matches-reference", "dense-local"),
    ),
    Fault(
        "int32-slot-overflow",
        "block * b + o computed in int32",
        "A slot id is block x b + offset. Computed in int32 it wraps once the cache holds more than 2^31 "
        "slots (e.g. 2^24 blocks of 128), giving negative or far-away slot ids.",
        ("vLLM #1486", "vLLM #1514"),
        TRITON,
        Knobs(kernel_fault=kernels.FAULT_INT32_SLOT),
        _int32,
        ("matches-reference", "no-collision"),
    ),
    Fault(
        "draft-overwrite",
        "draft slots and main slots share one buffer",
        "With PCP and an Eagle3 / MTP drafter, the draft slot mapping was computed on the CPU and copied "
        "into BlockTable.slot_mapping, the same buffer the main Triton kernel then wrote on the device. "
        "Two writers, one buffer, and the order decided who got whose slots: upstream the drafter read "
        "the main model's mapping. The fix computes the draft mapping separately.",
        ("vllm-ascend #8435",),
        ("v1",),
        Knobs(draft_overwrite=True),
        _draft,
        ("matches-reference", "dense-local", "padding"),
        "The oracle sees only the main model's buffer. cpsim models the same two writers with the draft "
        "copy landing last (request-major: each request's scheduled positions then num_spec - 1 "
        "look-ahead positions), so the main model reads draft slots. Upstream the kernel landed last "
        "and the drafter was the victim; that consumer is not modelled.",
    ),
    Fault(
        "short-request-rank",
        "a request shorter than I leaves ranks > 0 empty",
        "A request with fewer than I tokens lives entirely on rank 0; every other rank has an empty "
        "segment for it. Code that assumes each rank holds at least one token of every request breaks: "
        "cpsim models a v1 kernel that keeps a rank's segment non-empty by mapping the request's first "
        "token on a rank that owns nothing, through a table row with no blocks (the null block).",
        ("vllm-ascend #11807",),
        ("v1",),
        Knobs(kernel_fault=kernels.FAULT_SHORT_REQ),
        _short,
        ("exactly-one-owner", "matches-reference"),
        "The text of #11807 was not found; the model is one plausible failure of the 'every rank has a "
        "token' assumption at slot-mapping level. Failures in attention with a zero-length segment (LSE "
        "merge, seq_len 0) are outside cpsim.",
    ),
)

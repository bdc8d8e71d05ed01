"""The catalogue entries of docs/SPEC.md §6 and their smallest triggering scenarios.

Scenarios are kept tiny (one or a few requests, two CP ranks) so each entry runs
in seconds under the Triton interpreter. Faults that need huge values use a huge
*simulated* cache: the allocator only materialises the block ids it hands out.
"""

from __future__ import annotations

from cpsim import kernels
from cpsim.faults.fault import Fault
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


# ---- the per-group CP size era (vLLM MRV2 BlockTables, cpsim/kernels/mrv2.py) ----

def _mixed(name: str, kernel_block: int = 0) -> Scenario:
    """CP 4: a group sharded over all 4 ranks and one at CP size 2 (ranks 0/2 and 1/3 replicas)."""
    return _one(name, CPConfig(dcp=4, interleave=2),
                (KVGroup("full", "attention", 8, num_blocks=16),
                 KVGroup("half", "attention", 16 if kernel_block else 8, kernel_block, num_blocks=16, cp_size=2)),
                Limits(max_model_len=128, max_num_reqs=2, max_num_batched_tokens=32),
                [Request(0, 24, "prefill"), Request(40, 1, "decode")])


def _padded_drafts() -> Scenario:
    # A spec step of 1 + 3 tokens whose last 2 drafts were rejected, plus a graph-padded tail.
    return validate(Scenario("bug:is-padding-ignored", CPConfig(dcp=2, interleave=1),
                             (KVGroup("attn", "attention", 8, num_blocks=16),),
                             Limits(max_model_len=64, max_num_reqs=2, max_num_batched_tokens=16,
                                    num_speculative_tokens=3),
                             Batch((Request(5, 4, "spec", padded_drafts=2), Request(0, 3, "prefill")), (), 12)))


def _mrv2_tail() -> Scenario:
    return _padded_drafts().replace(name="bug:padded-count-tail")


# ---- prefix-cache replay padding (cpsim/kernels/replay_pad.py, cpsim/paths/replay_padding.py) ----

def _replay(name: str, request: Request, window: int) -> Scenario:
    """CP 2: a prefix-cacheable sharded group and a sliding-window group that left prefix caching
    with a replay window; one request re-runs part of [replay_start, replay_start + window)."""
    return _one(name, CPConfig(dcp=2, interleave=1),
                (KVGroup("attn", "attention", 8, num_blocks=16),
                 KVGroup("swa", "sliding_window", 8, cp_sharded=False, num_blocks=4, prefix_cacheable=False,
                         prefix_replay_tokens=window)),
                Limits(max_model_len=64, max_num_reqs=1, max_num_batched_tokens=16), [request])


REPLAY_REFS = ("vLLM #56227 (encoder-side SWA bounded replay, _pad_replayed_slots_kernel)",)

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
    Fault(
        "group-cp-size-ignored",
        "a partially replicated group sharded with the world CP size",
        "Upstream MRV2 gives each KV-cache group its own CP size g: a group at g = 4 under CP 8 is two "
        "replicas of a 4-way shard (ranks r and r + 4 hold the same slots). A kernel that reads the group "
        "CP size only as 'sharded or not' and shards every sharded group over the world size N splits that "
        "group N ways: each replica set holds only part of every token range, the two replicas hold "
        "different tokens, and the local offsets follow the wrong virtual block.",
        ("vLLM MRV2 BlockTables group_cp_sizes (no upstream issue found)",),
        ("v2",),
        Knobs(kernel_fault=kernels.FAULT_GROUP_CP_IGNORED),
        lambda: _mixed("group-cp-size-ignored"),
        ("exactly-one-owner", "replicas-agree", "matches-reference"),
        "Modelled in cpsim's MRV2 kernel (a group with 1 < g < N is launched with g = N).",
    ),
    Fault(
        "shard-rank-not-modulo",
        "shard rank taken as cp_rank instead of cp_rank % g",
        "For a group of CP size g the rank's shard is cp_rank % g. Comparing the owner (vo // I) % g with "
        "the raw cp_rank matches on ranks below g only: every rank of the second and later replica sets "
        "owns nothing and writes PAD for the whole group, so those replicas hold no KV at all while the "
        "first set looks perfect.",
        ("vLLM MRV2 BlockTables get_group_cp_parameters (no upstream issue found)",),
        ("v2",),
        Knobs(kernel_fault=kernels.FAULT_SHARD_IS_CP_RANK),
        lambda: _mixed("shard-rank-not-modulo"),
        ("exactly-one-owner", "replicas-agree", "matches-reference"),
    ),
    Fault(
        "virtual-block-uses-world-size",
        "virtual block sized B x N instead of B x g",
        "The virtual block of a group of CP size g holds g physical blocks (one per shard), B x g "
        "positions. Sizing it with the world size N while the owner uses g keeps ownership right but "
        "walks the table N / g times too slowly and lets the local offset run past B: tokens land at "
        "the wrong offsets and in the next physical block, overwriting each other.",
        ("vLLM MRV2 BlockTables group_cp_sizes (no upstream issue found)",),
        ("v2",),
        Knobs(kernel_fault=kernels.FAULT_VIRTUAL_FROM_WORLD),
        lambda: _mixed("virtual-block-uses-world-size"),
        ("dense-local", "matches-reference"),
    ),
    Fault(
        "kernel-block-size-ignored",
        "v2 slot computed with the physical block size over a kernel-block table",
        "MRV2 tables hold kernel-block ids (physical block q staged as q*BPK .. q*BPK+BPK-1) and the slot "
        "is table[local // b] * b + local % b with the kernel block size b. Using the physical B there "
        "(the value the user configured, before the attention backend forced a smaller kernel block) "
        "indexes the table BPK times too coarsely and scales ids by the wrong size: slots of other blocks.",
        ("vLLM #51031",),
        ("v2",),
        Knobs(kernel_fault=kernels.FAULT_KERNEL_BLOCK_IGNORED),
        lambda: _mixed("kernel-block-size-ignored", kernel_block=8),
        ("dense-local", "matches-reference"),
        "vLLM #51031 fixed the v2 DCP kernel reusing the user's block size instead of the kernel block "
        "size; cpsim models it in the slot formula of its MRV2 kernel.",
    ),
    Fault(
        "is-padding-ignored",
        "tokens flagged is_padding get real slots",
        "With speculative decoding a step schedules 1 + k tokens per request; drafts that were rejected "
        "(or added to fill a uniform batch) are flagged is_padding and must get PAD. A kernel that maps "
        "them like real tokens writes their garbage KV into the cache at positions the request will "
        "reuse - or through table entries past num_blocks, where stale block ids of freed blocks live.",
        ("vLLM MRV2 compute_slot_mappings(..., is_padding) (no upstream issue found)",),
        ("v2",),
        Knobs(kernel_fault=kernels.FAULT_PADDING_IGNORED),
        _padded_drafts,
        ("padding", "matches-reference"),
    ),
    Fault(
        "padded-count-tail",
        "MRV2 tail padded from the padded token count",
        "The last program of each group pads the slot buffer from query_start_loc[num_reqs], the real "
        "token count. Starting at num_tokens_padded instead leaves the entries between the last real "
        "token and the padded count unwritten: they keep stale valid slot ids from an earlier step and "
        "the graph-padded tokens write over real KV.",
        ("vLLM MRV2 kernel comment on stale slot ids from previous chunks", "vllm-ascend #11774",
         "vllm-ascend #3482"),
        ("v2",),
        Knobs(kernel_fault=kernels.FAULT_STALE_TAIL),
        _mrv2_tail,
        ("padding",),
        "The same mistake as stale-tail, in cpsim's MRV2 kernel (which gets the padded count only for "
        "this fault).",
    ),
    Fault(
        "replay-window-off-by-one",
        "replay padding one position late: (start, start + window]",
        "After a prefix hit ending at H the scheduler re-runs [H - W, H) to rebuild the groups that left "
        "prefix caching, and the replay pass pads exactly those positions in the prefix-cacheable groups. "
        "Counting the window one position late leaves the first replayed position with a real slot (the "
        "replay rewrites a cached block other requests share) and pads the first new position after the "
        "hit (its KV is never written in any cacheable group: later steps read garbage there).",
        REPLAY_REFS + ("no upstream issue found",),
        ALL,
        Knobs(kernel_fault=kernels.FAULT_REPLAY_OFF_BY_ONE),
        lambda: _replay("replay-window-off-by-one", Request(8, 6, "replay", replay_start=8), 4),
        ("replayed-is-pad", "exactly-one-owner", "matches-reference"),
        "Modelled in cpsim's replay kernel. Only the positions of the scheduled chunk can show it: a chunk "
        "that ends inside the window shows only the unpadded first position.",
    ),
    Fault(
        "replay-start-from-computed",
        "replay window counted from the chunk's first position, not replay_start",
        "The scheduler rewinds a request's computed tokens to replay_start, so on the replay's first chunk "
        "num_computed_tokens (the chunk's first position) equals replay_start and a pass that reads it "
        "instead looks right. When chunked prefill splits the replayed range, the next chunk starts past "
        "replay_start: the pass then pads [chunk start, chunk start + W), which runs past the replayed range "
        "and drops the KV of new positions in every prefix-cacheable group. vllm-ascend keeps the replay "
        "start per request across chunks for this reason.",
        REPLAY_REFS + ("vllm-ascend unit test test_replay_boundary_survives_chunking_and_batch_reordering "
                       "(guards the per-request start; no bug report found)",),
        ALL,
        Knobs(kernel_fault=kernels.FAULT_REPLAY_FROM_COMPUTED),
        lambda: _replay("replay-start-from-computed", Request(12, 6, "replay-chunk", replay_start=8), 8),
        ("exactly-one-owner", "owner-rule", "matches-reference"),
        "Modelled in cpsim's replay kernel (it loads the chunk's first position as the start). The replayed "
        "positions themselves stay PAD, so replayed-is-pad holds; the ownership invariants see the lost "
        "tokens past the window.",
    ),
    Fault(
        "replay-pads-every-group",
        "replay padding applied to every group, not only the prefix-cacheable ones",
        "The group that owns the replay (prefix_cacheable = false, e.g. DeepSeek-V4.1's sliding-window KV) "
        "left prefix caching: the replayed tokens are re-run precisely so that it writes them and rebuilds "
        "its window. A host that lists every group for the pass (instead of those whose spec is prefix "
        "cacheable) pads them there too: the window stays empty after every prefix hit and the first decode "
        "steps attend over missing KV.",
        REPLAY_REFS + ("vllm-ascend unit test test_only_cacheable_groups_are_padded (guards the list; no bug "
                       "report found)",),
        ALL,
        Knobs(kernel_fault=kernels.FAULT_REPLAY_ALL_GROUPS),
        lambda: _replay("replay-pads-every-group", Request(8, 6, "replay", replay_start=8), 4),
        ("replayed-is-pad", "exactly-one-owner", "matches-reference"),
        "Modelled in the launcher (cpsim/paths/replay_padding.py builds the group list), so it applies to a user's "
        "replay kernel as well.",
    ),
)

"""A replay-padding kernel in vLLM's ``_pad_replayed_slots_kernel`` signature (ABI ``vllm-replay-pad``),
written for these tests: groups in the outer loop, the window as an offset from the start."""

import triton
import triton.language as tl


@triton.jit
def _pad_replayed_slots_kernel(
    slot_mappings_ptr,
    group_stride,
    cacheable_groups_ptr,
    query_start_loc_ptr,
    positions_ptr,
    replay_start_ptr,
    window,
    pad_slot_id,
    NUM_GROUPS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    start = tl.load(replay_start_ptr + req)
    begin = tl.load(query_start_loc_ptr + req)
    end = tl.load(query_start_loc_ptr + req + 1)
    if start != 0:
        for i in tl.static_range(NUM_GROUPS):
            out = slot_mappings_ptr + tl.load(cacheable_groups_ptr + i) * group_stride
            for tok in range(begin, end, BLOCK):
                idx = tok + tl.arange(0, BLOCK)
                live = idx < end
                pos = tl.load(positions_ptr + idx, mask=live, other=0)
                hit = live & (pos >= start) & (pos - start < window)
                tl.store(out + idx, tl.zeros((BLOCK,), tl.int64) + pad_slot_id, mask=hit)

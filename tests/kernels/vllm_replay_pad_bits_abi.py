"""A replay-padding kernel in the bitmask form of ``_pad_replayed_slots_kernel`` (ABI
``vllm-replay-pad-bits``: bit g of CACHEABLE_GROUPS marks group g), written for these tests."""

import triton
import triton.language as tl


@triton.jit
def _pad_replayed_slots_kernel(
    slot_mappings_ptr,
    group_stride,
    query_start_loc_ptr,
    positions_ptr,
    replay_start_ptr,
    replay_window,
    pad_slot_id,
    CACHEABLE_GROUPS: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    start = tl.load(replay_start_ptr + req)
    if start > 0:
        begin = tl.load(query_start_loc_ptr + req)
        end = tl.load(query_start_loc_ptr + req + 1)
        for tok in range(begin, end, BLOCK):
            idx = tok + tl.arange(0, BLOCK)
            pos = tl.load(positions_ptr + idx, mask=idx < end, other=0)
            hit = (idx < end) & (pos >= start) & (pos < start + replay_window)
            for g in tl.static_range(NUM_GROUPS):
                if (CACHEABLE_GROUPS >> g) & 1:
                    tl.store(slot_mappings_ptr + g * group_stride + idx, pad_slot_id, mask=hit)

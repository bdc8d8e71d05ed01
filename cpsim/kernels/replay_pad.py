"""Prefix-cache replay padding in the upstream signature (ABI ``vllm-replay-pad``).

After a prefix hit the scheduler re-runs the hit's last window ``[replay_start,
replay_start + window)`` to rebuild the groups that left prefix caching (vLLM #56227,
``_pad_replayed_slots_kernel``). Those tokens must not write the groups that kept
their cached KV: the blocks are shared with every request that hit the same prefix.
This kernel runs after the slot-mapping kernel on the same ``[groups, entries]``
buffer and overwrites with PAD the replayed tokens of the groups listed in
``cacheable_groups``; it only ever writes PAD, so a token another CP rank owns
stays PAD. Grid ``(num_reqs,)``, one program per request; a request whose replay
start is 0 does not replay.

Written for triton-ascend as well as Triton (docs/ASCEND_CHECK.md, "Rules a kernel for triton-ascend follows"): contiguous masked loads of
the positions, scalar loads of the group indices, int32 position compares, no
``tl.gather`` and no ``%``. ``FAULT`` (a cpsim addition with a default, so the
parameter list still matches upstream) compiles in the catalogue's deviations.
"""

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
    FAULT: tl.constexpr = 0,
):
    req = tl.program_id(0)
    lo = tl.load(replay_start_ptr + req).to(tl.int32)
    if lo <= 0:  # this request does not replay
        return
    first = tl.load(query_start_loc_ptr + req)
    last = tl.load(query_start_loc_ptr + req + 1)
    if FAULT & 4096:  # replay-start-from-computed: the window counted from the chunk's first position
        lo = tl.load(positions_ptr + first, mask=first < last, other=0).to(tl.int32)
    if FAULT & 2048:  # replay-window-off-by-one: the window taken as (start, start + window]
        lo = lo + 1
    hi = lo + window
    for tile in range(first, last, BLOCK):
        offs = tile + tl.arange(0, BLOCK)
        inside = offs < last
        p = tl.load(positions_ptr + offs, mask=inside, other=-1).to(tl.int32)
        replayed = inside & (p >= lo) & (p < hi)
        pad = tl.zeros((BLOCK,), tl.int64) + pad_slot_id
        for i in tl.static_range(NUM_GROUPS):
            row = slot_mappings_ptr + tl.load(cacheable_groups_ptr + i).to(tl.int64) * group_stride
            tl.store(row + offs, pad.to(row.dtype.element_ty), mask=replayed)

"""A multi-group slot-mapping kernel in vllm-ascend's adaptive fused v1 ABI (CP size 1), for cpsim's tests.

Parameter list and launch as ``_compute_slot_mapping_fused_groups_adaptive_kernel`` in
stored vllm-ascend copies: grid ``(num_groups * (NUM_REQS + 1),)``, one program per
(group, request) plus a padding program per group; a request of at most
``SMALL_TILE_BLOCK_SIZE`` tokens is done in one small tile, longer ones in 1024-token
tiles. Our own plain body (the window sizes are accepted and not needed here).
"""

import triton
import triton.language as tl


@triton.jit
def _slots(table, out, req, positions_ptr, start, end, stride, bs, circular, PAD_ID: tl.constexpr,
           TILE: tl.constexpr):
    for i in range(start, end, TILE):
        offs = i + tl.arange(0, TILE)
        mask = offs < end
        p = tl.load(positions_ptr + offs, mask=mask, other=0).to(tl.int64)
        idx = tl.where(circular, 0, p // bs)
        ok = mask & (p >= 0) & (idx < stride)
        blk = tl.load(table + req.to(tl.int64) * stride + idx, mask=ok, other=0).to(tl.int64)
        slot = tl.where(ok, blk * bs + p % bs, PAD_ID)
        tl.store(out + offs, slot.to(tl.int32), mask=mask)


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens"])
def _compute_slot_mapping_fused_groups_adaptive_kernel(
    num_tokens,
    max_num_tokens,
    query_start_loc_ptr,
    positions_ptr,
    block_table_addrs_ptr,
    slot_mapping_addrs_ptr,
    block_table_strides_ptr,
    block_sizes_ptr,
    is_circular_ptr,
    HAS_CIRCULAR: tl.constexpr,
    PAD_ID: tl.constexpr,
    NUM_REQS: tl.constexpr,
    SMALL_TILE_BLOCK_SIZE: tl.constexpr,
    SMALL_BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
    LARGE_BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
):
    per_group: tl.constexpr = NUM_REQS + 1
    group = tl.program_id(0) // per_group
    req = tl.program_id(0) % per_group
    table = tl.load(block_table_addrs_ptr + group).to(tl.pointer_type(tl.int32))
    out = tl.load(slot_mapping_addrs_ptr + group).to(tl.pointer_type(tl.int32))
    if req == NUM_REQS:
        pad_from = tl.load(query_start_loc_ptr + NUM_REQS)
        for i in range(pad_from, max_num_tokens, 1024):
            offs = i + tl.arange(0, 1024)
            tl.store(out + offs, tl.full((1024,), PAD_ID, tl.int32), mask=offs < max_num_tokens)
        return
    start = tl.load(query_start_loc_ptr + req)
    end = tl.load(query_start_loc_ptr + req + 1)
    stride = tl.load(block_table_strides_ptr + group)
    bs = tl.load(block_sizes_ptr + group).to(tl.int64)
    circular = False
    if HAS_CIRCULAR:
        circular = tl.load(is_circular_ptr + group) != 0
    if end - start <= SMALL_TILE_BLOCK_SIZE:
        _slots(table, out, req, positions_ptr, start, end, stride, bs, circular, PAD_ID, SMALL_TILE_BLOCK_SIZE)
    else:
        _slots(table, out, req, positions_ptr, start, end, stride, bs, circular, PAD_ID, 1024)

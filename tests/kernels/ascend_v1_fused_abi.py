"""A multi-group slot-mapping kernel in vllm-ascend's fused v1 ABI (CP size 1), for cpsim's tests.

Parameter list and launch as ``_compute_slot_mapping_fused_groups_kernel`` in a stored
vllm-ascend copy: grid ``(num_groups * (NUM_REQS * PARALLEL_TILES + 1),)``, per-group
table and int32 output pointers. Our own plain body.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens"])
def _compute_slot_mapping_fused_groups_kernel(
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
    TILE_BLOCK_SIZE: tl.constexpr,
    PARALLEL_TILES: tl.constexpr,
    BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
):
    per_group: tl.constexpr = NUM_REQS * PARALLEL_TILES + 1
    group = tl.program_id(0) // per_group
    local = tl.program_id(0) % per_group
    table = tl.load(block_table_addrs_ptr + group).to(tl.pointer_type(tl.int32))
    out = tl.load(slot_mapping_addrs_ptr + group).to(tl.pointer_type(tl.int32))
    if local == per_group - 1:
        pad_from = tl.load(query_start_loc_ptr + NUM_REQS)
        for i in range(pad_from, max_num_tokens, TILE_BLOCK_SIZE):
            offs = i + tl.arange(0, TILE_BLOCK_SIZE)
            tl.store(out + offs, tl.full((TILE_BLOCK_SIZE,), PAD_ID, tl.int32), mask=offs < max_num_tokens)
        return
    req = local // PARALLEL_TILES
    first = local % PARALLEL_TILES
    start = tl.load(query_start_loc_ptr + req)
    end = tl.load(query_start_loc_ptr + req + 1)
    stride = tl.load(block_table_strides_ptr + group)
    bs = tl.load(block_sizes_ptr + group).to(tl.int64)
    circular = False
    if HAS_CIRCULAR:
        circular = tl.load(is_circular_ptr + group) != 0
    for i in range(start + first * TILE_BLOCK_SIZE, end, TILE_BLOCK_SIZE * PARALLEL_TILES):
        offs = i + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offs < end
        p = tl.load(positions_ptr + offs, mask=mask, other=0).to(tl.int64)
        idx = tl.where(circular, 0, p // bs)
        ok = mask & (p >= 0) & (idx < stride)
        blk = tl.load(table + req.to(tl.int64) * stride + idx, mask=ok, other=0).to(tl.int64)
        slot = tl.where(ok, blk * bs + p % bs, PAD_ID)
        tl.store(out + offs, slot.to(tl.int32), mask=mask)

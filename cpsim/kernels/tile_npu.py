"""Tile-parallel kernels written to triton-ascend's rules (chosen on ``npu`` by ``cpsim.kernels.select``).

Same arguments and results as ``tile_v1`` / ``tile_v2``; what differs is the design:
- a persistent grid: the launch has at most one program per vector core and each
  program walks tiles ``pid, pid + programs, ...`` (grids far beyond the core count
  run in slow batches on Ascend);
- one scalar table pointer per group (``tl.static_range`` over the groups) instead
  of a vector of pointers cast from int64, which ``triton-adapter-opt`` cannot lower;
  per-group parameters are scalars, so the sharded / plain index forms are a scalar
  branch rather than a per-element select;
- remainders as multiply-subtract; int32 gathers through float32 halves (exact).
The CUDA kernels keep their [groups, tile] blocks, faster on a GPU (docs/BENCHMARKS.md).
"""

import triton
import triton.language as tl

from cpsim.kernels._common import gather_i32
from cpsim.kernels._tile import find_requests_from, log2_pow2, read_blocks, slot_of, write_mask
from cpsim.kernels.tile_v1 import v1_tile


@triton.jit(do_not_specialize=["num_tokens", "num_reqs"])
def _tile_slot_mapping_kernel(
    num_tokens,
    max_num_tokens,
    num_reqs,
    query_start_loc_ptr,
    positions_ptr,
    block_table_ptr,
    block_table_stride,
    block_size: tl.constexpr,
    slot_mapping_ptr,
    KV_CACHE_BLOCK_SIZE: tl.constexpr,
    BLOCKS_PER_KV_BLOCK: tl.constexpr,
    TOTAL_CP_WORLD_SIZE: tl.constexpr,
    TOTAL_CP_RANK: tl.constexpr,
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TILE: tl.constexpr,
    REQ_BLOCK: tl.constexpr,
    IS_CIRCULAR: tl.constexpr = False,
    FAULT: tl.constexpr = 0,
    POS_INT32: tl.constexpr = True,
):
    for tile in range(tl.program_id(0), tl.cdiv(max_num_tokens, TILE), tl.num_programs(0)):
        v1_tile(tile * TILE, num_tokens, max_num_tokens, num_reqs, query_start_loc_ptr, positions_ptr,
                block_table_ptr, block_table_stride, block_size, slot_mapping_ptr, KV_CACHE_BLOCK_SIZE,
                BLOCKS_PER_KV_BLOCK, TOTAL_CP_WORLD_SIZE, TOTAL_CP_RANK, CP_KV_CACHE_INTERLEAVE_SIZE, PAD_ID,
                TILE, REQ_BLOCK, IS_CIRCULAR, FAULT, POS_INT32)


@triton.jit(do_not_specialize=["num_tokens", "num_reqs", "slot_mapping_stride"])
def _tile_slot_mapping_fused_kernel(
    num_tokens,
    max_num_tokens,
    num_reqs,
    query_start_loc_ptr,
    positions_ptr,
    block_table_ptrs,
    block_table_strides,
    block_sizes,
    is_circular,
    slot_mapping_ptr,
    slot_mapping_stride,
    PAD_ID: tl.constexpr,
    TILE: tl.constexpr,
    REQ_BLOCK: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    GROUP_BLOCK: tl.constexpr,
    FAULT: tl.constexpr = 0,
    POS_INT32: tl.constexpr = True,
    POW2: tl.constexpr = False,
):
    """All groups of a CP-size-1 model in one launch (``GROUP_BLOCK`` is unused: same launch as CUDA)."""
    for tile in range(tl.program_id(0), tl.cdiv(max_num_tokens, TILE), tl.num_programs(0)):
        t0 = tile * TILE
        t = t0 + tl.arange(0, TILE)
        req, actual = find_requests_from(query_start_loc_ptr, num_reqs, t0, t, TILE, REQ_BLOCK)
        tok = (t < actual) & (t < max_num_tokens)
        pos = tl.load(positions_ptr + t, mask=tok, other=0)
        if POS_INT32:
            pos = pos.to(tl.int32)
        valid = tok & (pos >= 0)
        wm = write_mask(t, max_num_tokens, actual, num_tokens, FAULT)
        for gi in tl.static_range(NUM_GROUPS):
            table = tl.load(block_table_ptrs + gi).to(tl.pointer_type(tl.int32))
            stride = tl.load(block_table_strides + gi)
            bs = tl.load(block_sizes + gi)
            if not POS_INT32:
                bs = bs.to(tl.int64)
            if POW2:
                k = pos >> log2_pow2(bs)
                o = pos & (bs - 1)
            else:
                k = pos // bs
                o = pos - k * bs
            if tl.load(is_circular + gi) != 0:
                k = k * 0
            ok = valid & (k < stride)  # PAD past the row's end: a tail group (SPEC §2.4)
            blk = read_blocks(table + req.to(tl.int64) * stride, stride, k, ok, FAULT)
            slot = tl.where(ok, slot_of(blk, bs, o, FAULT), PAD_ID)
            out = slot_mapping_ptr + slot_mapping_stride.to(tl.int64) * gi
            tl.store(out + t, slot.to(slot_mapping_ptr.dtype.element_ty), mask=wm)


@triton.jit(do_not_specialize=["num_tokens", "num_reqs", "cp_rank", "slot_mappings_stride"])
def _tile_slot_mappings_kernel(
    num_tokens,
    max_num_tokens,
    num_reqs,
    idx_mapping,
    query_start_loc,
    pos,
    block_table_ptrs,
    block_table_strides,
    block_sizes,
    slot_mappings_ptr,
    slot_mappings_stride,
    cp_rank,
    CP_SIZE: tl.constexpr,
    CP_INTERLEAVE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TRITON_BLOCK_SIZE: tl.constexpr,
    slot_mapping_enabled,
    group_cp_sizes,
    is_circular,
    NUM_GROUPS: tl.constexpr,
    GROUP_BLOCK: tl.constexpr,
    REQ_BLOCK: tl.constexpr,
    FAULT: tl.constexpr = 0,
    POS_INT32: tl.constexpr = True,
    POW2: tl.constexpr = False,
):
    TILE: tl.constexpr = TRITON_BLOCK_SIZE
    for tile in range(tl.program_id(0), tl.cdiv(max_num_tokens, TILE), tl.num_programs(0)):
        t0 = tile * TILE
        t = t0 + tl.arange(0, TILE)
        req, actual = find_requests_from(query_start_loc, num_reqs, t0, t, TILE, REQ_BLOCK)
        ridx = tl.arange(0, REQ_BLOCK)
        rows = tl.load(idx_mapping + ridx, mask=ridx < num_reqs, other=-1)
        row = gather_i32(rows, req)
        tok = (t < actual) & (t < max_num_tokens)
        p = tl.load(pos + t, mask=tok, other=0)
        if POS_INT32:
            p = p.to(tl.int32)
        live = tok & (row >= 0)
        wm = write_mask(t, max_num_tokens, actual, num_tokens, FAULT) & ((t >= actual) | (row >= 0))
        for gi in tl.static_range(NUM_GROUPS):
            table = tl.load(block_table_ptrs + gi).to(tl.pointer_type(tl.int32))
            stride = tl.load(block_table_strides + gi)
            bs = tl.load(block_sizes + gi)
            if not POS_INT32:
                bs = bs.to(tl.int64)
            sharded = tl.load(group_cp_sizes + gi) > 1
            if FAULT & 16:  # cp-applied-to-unsharded-groups
                sharded = CP_SIZE > 1
            if sharded:
                # Virtual block of B * N positions; each rank keeps its interleaved share densely.
                if POW2:
                    vo = p & (bs * CP_SIZE - 1)
                    k = (p >> log2_pow2(bs)) // CP_SIZE
                else:
                    k = p // (bs * CP_SIZE)
                    vo = p - k * (bs * CP_SIZE)
                chunk = vo // CP_INTERLEAVE
                local = chunk - (chunk // CP_SIZE) * CP_SIZE == cp_rank
                o = (vo // (CP_SIZE * CP_INTERLEAVE)) * CP_INTERLEAVE + (vo - chunk * CP_INTERLEAVE)
            else:
                if POW2:
                    k = p >> log2_pow2(bs)
                    o = p & (bs - 1)
                else:
                    k = p // bs
                    o = p - k * bs
                local = p >= 0
            if tl.load(is_circular + gi) != 0:
                k = k * 0
            valid = live & local & (tl.load(slot_mapping_enabled + gi) != 0)
            blk = read_blocks(table + row.to(tl.int64) * stride, stride, k, valid, FAULT)
            slot = tl.where(valid, slot_of(blk, bs, o, FAULT), PAD_ID)
            out = slot_mappings_ptr + slot_mappings_stride.to(tl.int64) * gi
            tl.store(out + t, slot.to(slot_mappings_ptr.dtype.element_ty), mask=wm)

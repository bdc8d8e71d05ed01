"""Tile-parallel v1 slot-mapping kernels (vllm-ascend ``BlockTable`` semantics).

Same arguments as ``triton_v1`` plus ``num_reqs`` (the per-request kernels get it
from their grid) and the tile constexprs; ``block_size`` is a constexpr here so
that divisions by it compile to shifts. Grid: ``(cdiv(max_num_tokens, TILE),)``
whatever the batch, so one CUDA graph serves every batch of a capture size.

Integer width: positions are narrowed to int32 only when the caller sets
``POS_INT32`` (it proves ``max_model_len < 2**31``); every slot is formed in
int64 (``FAULT`` 8 reproduces the int32 overflow on purpose).
"""

import triton
import triton.language as tl

from cpsim.kernels._tile import find_requests, find_requests_from, log2_pow2, read_blocks, slot_of, write_mask


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
    v1_tile(tl.program_id(0) * TILE, num_tokens, max_num_tokens, num_reqs, query_start_loc_ptr, positions_ptr,
            block_table_ptr, block_table_stride, block_size, slot_mapping_ptr, KV_CACHE_BLOCK_SIZE,
            BLOCKS_PER_KV_BLOCK, TOTAL_CP_WORLD_SIZE, TOTAL_CP_RANK, CP_KV_CACHE_INTERLEAVE_SIZE, PAD_ID, TILE,
            REQ_BLOCK, IS_CIRCULAR, FAULT, POS_INT32)


@triton.jit
def v1_tile(t0, num_tokens, max_num_tokens, num_reqs, query_start_loc_ptr, positions_ptr, block_table_ptr,
            block_table_stride, block_size: tl.constexpr, slot_mapping_ptr, KV_CACHE_BLOCK_SIZE: tl.constexpr,
            BLOCKS_PER_KV_BLOCK: tl.constexpr, TOTAL_CP_WORLD_SIZE: tl.constexpr, TOTAL_CP_RANK: tl.constexpr,
            CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr, PAD_ID: tl.constexpr, TILE: tl.constexpr,
            REQ_BLOCK: tl.constexpr, IS_CIRCULAR: tl.constexpr, FAULT: tl.constexpr, POS_INT32: tl.constexpr):
    """Entries ``[t0, t0 + TILE)`` of one group's slot buffer (shared by the CUDA and NPU kernels).

    Remainders are written as multiply-subtract (``x - (x // d) * d``, the same
    value as ``%`` for either sign): Ascend's vector unit has no integer remainder.
    """
    t = t0 + tl.arange(0, TILE)
    req, actual = find_requests_from(query_start_loc_ptr, num_reqs, t0, t, TILE, REQ_BLOCK)
    tok = (t < actual) & (t < max_num_tokens)
    pos = tl.load(positions_ptr + t, mask=tok, other=0)
    if POS_INT32:
        pos = pos.to(tl.int32)
    if IS_CIRCULAR:
        k = pos * 0
        o = pos - (pos // block_size) * block_size
        local = pos >= 0
    elif TOTAL_CP_WORLD_SIZE > 1:
        V: tl.constexpr = KV_CACHE_BLOCK_SIZE * TOTAL_CP_WORLD_SIZE
        W: tl.constexpr = TOTAL_CP_WORLD_SIZE * CP_KV_CACHE_INTERLEAVE_SIZE
        vb = pos // V
        vo = pos - vb * V
        chunk = vo // CP_KV_CACHE_INTERLEAVE_SIZE
        local = chunk - (chunk // TOTAL_CP_WORLD_SIZE) * TOTAL_CP_WORLD_SIZE == TOTAL_CP_RANK
        lo = (vo // W) * CP_KV_CACHE_INTERLEAVE_SIZE + (vo - chunk * CP_KV_CACHE_INTERLEAVE_SIZE)
        kb = lo // block_size
        k = vb * BLOCKS_PER_KV_BLOCK + kb
        o = lo - kb * block_size
    else:
        k = pos // block_size
        o = pos - k * block_size
        local = pos >= 0
    valid = tok & local & (k < block_table_stride)  # PAD past the row's end: a tail group (SPEC §2.4)
    ptrs = block_table_ptr + req.to(tl.int64) * block_table_stride
    blk = read_blocks(ptrs, block_table_stride, k, valid, FAULT)
    if FAULT & 8:
        slot = (blk * block_size + o.to(tl.int32)).to(tl.int64)
    else:
        slot = blk.to(tl.int64) * block_size + o.to(tl.int64)
    slot = tl.where(valid, slot, PAD_ID)
    tl.store(slot_mapping_ptr + t, slot.to(slot_mapping_ptr.dtype.element_ty),
             mask=write_mask(t, max_num_tokens, actual, num_tokens, FAULT))


@triton.jit(do_not_specialize=["num_tokens", "num_reqs"])
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
    """All groups of a CP-size-1 model in one launch: a [groups, TILE] block per program."""
    t = tl.program_id(0) * TILE + tl.arange(0, TILE)
    req, actual = find_requests(query_start_loc_ptr, num_reqs, t, TILE, REQ_BLOCK)
    tok = (t < actual) & (t < max_num_tokens)
    pos = tl.load(positions_ptr + t, mask=tok, other=0)
    if POS_INT32:
        pos = pos.to(tl.int32)
    g = tl.arange(0, GROUP_BLOCK)
    has = g < NUM_GROUPS
    table = tl.load(block_table_ptrs + g, mask=has, other=0).to(tl.pointer_type(tl.int32))
    stride = tl.load(block_table_strides + g, mask=has, other=0)
    bs = tl.load(block_sizes + g, mask=has, other=1)
    if not POS_INT32:
        bs = bs.to(tl.int64)
    circular = tl.load(is_circular + g, mask=has, other=0) != 0
    p = pos[None, :]
    b2 = bs[:, None]
    if POW2:
        k = tl.where(circular[:, None], 0, p >> log2_pow2(bs)[:, None])
        o = p & (b2 - 1)
    else:
        k = tl.where(circular[:, None], 0, p // b2)
        o = p % b2
    valid = has[:, None] & (tok & (pos >= 0))[None, :] & (k < stride[:, None])  # PAD past a tail row's end
    ptrs = table[:, None] + (req.to(tl.int64)[None, :] * stride[:, None])
    blk = read_blocks(ptrs, stride[:, None], k, valid, FAULT)
    slot = tl.where(valid, slot_of(blk, b2, o, FAULT), PAD_ID)
    out = slot_mapping_ptr + g.to(tl.int64)[:, None] * slot_mapping_stride + t[None, :]
    m = has[:, None] & write_mask(t, max_num_tokens, actual, num_tokens, FAULT)[None, :]
    tl.store(out, slot.to(slot_mapping_ptr.dtype.element_ty), mask=m)

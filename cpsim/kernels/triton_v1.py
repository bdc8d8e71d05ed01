"""v1 slot-mapping kernels (vllm-ascend ``BlockTable`` semantics and argument list).

One program per request plus one padding program; each request is walked in
tiles of ``TILE_BLOCK_SIZE`` tokens. The table is the *logical* one (kernel blocks
of size ``block_size``; a physical block of ``KV_CACHE_BLOCK_SIZE`` spans
``BLOCKS_PER_KV_BLOCK`` entries).

``POS_INT32`` (set by the paths when ``max_model_len < 2**31``: every intermediate of
the index math is at most the position) does the position math in int32, which
Ascend's vector unit runs natively; slots are formed in int64 either way.
"""

import triton
import triton.language as tl

from cpsim.kernels._common import lookup_slots, pad_tail


@triton.jit
def _compute_slot_mapping_kernel(
    num_tokens,
    max_num_tokens,
    query_start_loc_ptr,
    positions_ptr,
    block_table_ptr,
    block_table_stride,
    block_size,
    slot_mapping_ptr,
    KV_CACHE_BLOCK_SIZE: tl.constexpr,
    BLOCKS_PER_KV_BLOCK: tl.constexpr,
    TOTAL_CP_WORLD_SIZE: tl.constexpr,
    TOTAL_CP_RANK: tl.constexpr,
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
    BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
    IS_CIRCULAR: tl.constexpr = False,
    FAULT: tl.constexpr = 0,
    POS_INT32: tl.constexpr = False,
):
    req = tl.program_id(0)
    if req == tl.num_programs(0) - 1:
        start = tl.load(query_start_loc_ptr + req)
        if FAULT & 1:  # stale-tail
            start = num_tokens
        pad_tail(slot_mapping_ptr, start, max_num_tokens, PAD_ID, TILE_BLOCK_SIZE)
        return

    start = tl.load(query_start_loc_ptr + req)
    end = tl.load(query_start_loc_ptr + req + 1)
    row_ptr = block_table_ptr + req.to(tl.int64) * block_table_stride
    for tile in range(start, end, TILE_BLOCK_SIZE):
        offs = tile + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offs < end
        pos = tl.load(positions_ptr + offs, mask=mask, other=0)
        pos = pos.to(tl.int32) if POS_INT32 else pos.to(tl.int64)
        V: tl.constexpr = KV_CACHE_BLOCK_SIZE * TOTAL_CP_WORLD_SIZE
        if IS_CIRCULAR or TOTAL_CP_WORLD_SIZE == 1:
            local = pos >= 0
        else:
            # Positions interleave over ranks inside a virtual block of B * N
            # positions; each rank keeps its share densely in one physical block.
            # Remainders as multiply-subtract (Ascend's vector unit has no integer remainder).
            vb = pos // V
            vo = pos - vb * V
            chunk = vo // CP_KV_CACHE_INTERLEAVE_SIZE
            local = chunk - (chunk // TOTAL_CP_WORLD_SIZE) * TOTAL_CP_WORLD_SIZE == TOTAL_CP_RANK
            if FAULT & 32:  # short-request-rank: no rank is left with an empty segment
                last = tl.load(positions_ptr + end - 1).to(tl.int64)
                empty = last < TOTAL_CP_RANK * CP_KV_CACHE_INTERLEAVE_SIZE
                local = local | (empty & (offs == start))
        valid = mask & local
        slot = tl.full((TILE_BLOCK_SIZE,), PAD_ID, tl.int64)
        # A tile this rank owns nothing of skips the table walk (fewer interpreted ops; same result).
        if tl.max(valid.to(tl.int32), 0) > 0:
            if IS_CIRCULAR:
                k = pos * 0
                o = pos - (pos // block_size) * block_size
            elif TOTAL_CP_WORLD_SIZE > 1:
                lo = (vo // (TOTAL_CP_WORLD_SIZE * CP_KV_CACHE_INTERLEAVE_SIZE)) * CP_KV_CACHE_INTERLEAVE_SIZE \
                    + (vo - chunk * CP_KV_CACHE_INTERLEAVE_SIZE)
                kb = lo // block_size
                k = vb * BLOCKS_PER_KV_BLOCK + kb
                o = lo - kb * block_size
            else:
                k = pos // block_size
                o = pos - k * block_size
            slot = lookup_slots(row_ptr, block_table_stride, k, o, valid, block_size, PAD_ID,
                                BLOCK_TABLE_WINDOW_SIZE, FAULT)
        tl.store(slot_mapping_ptr + offs, slot.to(slot_mapping_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _compute_slot_mapping_fused_kernel(
    num_tokens,
    max_num_tokens,
    query_start_loc_ptr,
    positions_ptr,
    block_table_ptrs,
    block_table_strides,
    block_sizes,
    is_circular,
    slot_mapping_ptr,
    slot_mapping_stride,
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
    BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
    FAULT: tl.constexpr = 0,
    POS_INT32: tl.constexpr = False,
):
    """All groups in one launch, grid (groups, num_reqs + 1); CP world size 1 only."""
    group = tl.program_id(0)
    req = tl.program_id(1)
    out_ptr = slot_mapping_ptr + group.to(tl.int64) * slot_mapping_stride
    if req == tl.num_programs(1) - 1:
        start = tl.load(query_start_loc_ptr + req)
        if FAULT & 1:
            start = num_tokens
        pad_tail(out_ptr, start, max_num_tokens, PAD_ID, TILE_BLOCK_SIZE)
        return

    table_ptr = tl.load(block_table_ptrs + group).to(tl.pointer_type(tl.int32))
    stride = tl.load(block_table_strides + group)
    block_size = tl.load(block_sizes + group)
    if not POS_INT32:
        block_size = block_size.to(tl.int64)
    circular = tl.load(is_circular + group) != 0
    start = tl.load(query_start_loc_ptr + req)
    end = tl.load(query_start_loc_ptr + req + 1)
    row_ptr = table_ptr + req.to(tl.int64) * stride
    for tile in range(start, end, TILE_BLOCK_SIZE):
        offs = tile + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offs < end
        pos = tl.load(positions_ptr + offs, mask=mask, other=0)
        pos = pos.to(tl.int32) if POS_INT32 else pos.to(tl.int64)
        kp = pos // block_size
        k = tl.where(circular, 0, kp)
        o = pos - kp * block_size
        valid = mask & (pos >= 0)
        slot = lookup_slots(row_ptr, stride, k, o, valid, block_size, PAD_ID, BLOCK_TABLE_WINDOW_SIZE, FAULT)
        tl.store(out_ptr + offs, slot.to(out_ptr.dtype.element_ty), mask=mask)

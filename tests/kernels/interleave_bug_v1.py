"""A v1-ABI kernel with the one-line interleave bug a newcomer writes (issue 30): a rank owns
``p % N`` instead of ``(p // I) % N``, so with an interleave I > 1 each rank stores the wrong
tokens. The rest is ``ascend_v1_abi.py``. Used by the report tests and docs/img/report_user_kernel.png.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens"])
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
):
    req = tl.program_id(0)
    if req == tl.num_programs(0) - 1:
        pad_from = tl.load(query_start_loc_ptr + req)
        for i in range(pad_from, max_num_tokens, TILE_BLOCK_SIZE):
            offs = i + tl.arange(0, TILE_BLOCK_SIZE)
            tl.store(slot_mapping_ptr + offs, tl.full((TILE_BLOCK_SIZE,), PAD_ID, tl.int32),
                     mask=offs < max_num_tokens)
        return
    start = tl.load(query_start_loc_ptr + req)
    end = tl.load(query_start_loc_ptr + req + 1)
    row = block_table_ptr + req.to(tl.int64) * block_table_stride
    for i in range(start, end, TILE_BLOCK_SIZE):
        offs = i + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offs < end
        pos = tl.load(positions_ptr + offs, mask=mask, other=0).to(tl.int64)
        if IS_CIRCULAR:
            idx = pos * 0
            off = pos % block_size
            mine = pos >= 0
        elif TOTAL_CP_WORLD_SIZE == 1:
            idx = pos // block_size
            off = pos % block_size
            mine = pos >= 0
        else:
            span = KV_CACHE_BLOCK_SIZE * TOTAL_CP_WORLD_SIZE
            vb = pos // span
            vo = pos % span
            mine = vo % TOTAL_CP_WORLD_SIZE == TOTAL_CP_RANK  # BUG: the interleave is forgotten
            rounds = vo // (TOTAL_CP_WORLD_SIZE * CP_KV_CACHE_INTERLEAVE_SIZE)
            local = rounds * CP_KV_CACHE_INTERLEAVE_SIZE + vo % CP_KV_CACHE_INTERLEAVE_SIZE
            idx = vb * BLOCKS_PER_KV_BLOCK + local // block_size
            off = local % block_size
        ok = mask & mine & (idx < block_table_stride)
        blk = tl.load(row + idx, mask=ok, other=0).to(tl.int64)
        slot = tl.where(ok, blk * block_size + off, PAD_ID)
        tl.store(slot_mapping_ptr + offs, slot.to(tl.int32), mask=mask)

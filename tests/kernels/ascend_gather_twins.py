"""Two tiny v1-ABI kernels that differ only in the dtype they gather: the Ascend check must tell them apart.

triton-ascend's ``tl.gather`` rejects int32 tensors; ``int32_gather_kernel`` gathers the
block-table window as int32 and must FAIL ``cpsim ascend-check``, its twin
``fp32_gather_kernel`` gathers the same window as float32 (inexact above 2**24 ids:
compile discrimination only, not a kernel to use) and must PASS.
"""

import triton
import triton.language as tl


@triton.jit
def _tiny_v1(query_start_loc_ptr, positions_ptr, block_table_ptr, block_table_stride, block_size,
             slot_mapping_ptr, TILE_BLOCK_SIZE: tl.constexpr, BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
             AS_FP32: tl.constexpr):
    req = tl.program_id(0)
    start = tl.load(query_start_loc_ptr + req)
    end = tl.load(query_start_loc_ptr + req + 1)
    offs = start + tl.arange(0, TILE_BLOCK_SIZE)
    mask = offs < end
    pos = tl.load(positions_ptr + offs, mask=mask, other=0)
    w = tl.arange(0, BLOCK_TABLE_WINDOW_SIZE)
    win = tl.load(block_table_ptr + req * block_table_stride + w, mask=w < block_table_stride, other=0)
    k = tl.minimum(pos // block_size, BLOCK_TABLE_WINDOW_SIZE - 1).to(tl.int32)
    if AS_FP32:
        blk = tl.gather(win.to(tl.float32), k, 0).to(tl.int32)
    else:
        blk = tl.gather(win, k, 0)
    tl.store(slot_mapping_ptr + offs, (blk * block_size + pos % block_size).to(tl.int32), mask=mask)


@triton.jit
def int32_gather_kernel(num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr, block_table_ptr,
                        block_table_stride, block_size, slot_mapping_ptr, KV_CACHE_BLOCK_SIZE: tl.constexpr,
                        BLOCKS_PER_KV_BLOCK: tl.constexpr, TOTAL_CP_WORLD_SIZE: tl.constexpr,
                        TOTAL_CP_RANK: tl.constexpr, CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
                        PAD_ID: tl.constexpr, TILE_BLOCK_SIZE: tl.constexpr, BLOCK_TABLE_WINDOW_SIZE: tl.constexpr):
    _tiny_v1(query_start_loc_ptr, positions_ptr, block_table_ptr, block_table_stride, block_size,
             slot_mapping_ptr, TILE_BLOCK_SIZE, BLOCK_TABLE_WINDOW_SIZE, False)


@triton.jit
def fp32_gather_kernel(num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr, block_table_ptr,
                       block_table_stride, block_size, slot_mapping_ptr, KV_CACHE_BLOCK_SIZE: tl.constexpr,
                       BLOCKS_PER_KV_BLOCK: tl.constexpr, TOTAL_CP_WORLD_SIZE: tl.constexpr,
                       TOTAL_CP_RANK: tl.constexpr, CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
                       PAD_ID: tl.constexpr, TILE_BLOCK_SIZE: tl.constexpr, BLOCK_TABLE_WINDOW_SIZE: tl.constexpr):
    _tiny_v1(query_start_loc_ptr, positions_ptr, block_table_ptr, block_table_stride, block_size,
             slot_mapping_ptr, TILE_BLOCK_SIZE, BLOCK_TABLE_WINDOW_SIZE, True)

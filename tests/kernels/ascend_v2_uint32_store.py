"""``ascend_v2_abi.py`` (vllm-ascend's MRV2 ABI, int32 output) with one change: a token's slot, PAD
included, is stored as uint32. Into the int32 buffer its host allocates that is the same bits (PAD reads
back -1); into an int64 buffer (``limits.slot_buffer_dtype = "int64"``, a vLLM host's) the store
zero-extends and PAD reads back 4294967295. A defect only a buffer of the other dtype shows.
"""

import triton
import triton.language as tl


@triton.jit
def _compute_slot_mappings_kernel(
    max_num_tokens,
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
    BLOCK_TABLE_PAD_SIZE: tl.constexpr,
    slot_mapping_enabled=None,
    HAS_SLOT_MAPPING_ENABLED: tl.constexpr = False,
):
    group = tl.program_id(0)
    batch_idx = tl.program_id(1)
    out = slot_mappings_ptr + group.to(tl.int64) * slot_mappings_stride
    if batch_idx == tl.num_programs(1) - 1:
        pad_from = tl.load(query_start_loc + batch_idx)
        for i in range(pad_from, max_num_tokens, TRITON_BLOCK_SIZE):
            offs = i + tl.arange(0, TRITON_BLOCK_SIZE)
            tl.store(out + offs, tl.full((TRITON_BLOCK_SIZE,), PAD_ID, tl.int32), mask=offs < max_num_tokens)
        return
    start = tl.load(query_start_loc + batch_idx)
    end = tl.load(query_start_loc + batch_idx + 1)
    row = tl.load(idx_mapping + batch_idx)
    enabled = True
    if HAS_SLOT_MAPPING_ENABLED:
        enabled = tl.load(slot_mapping_enabled + group) != 0
    table = tl.load(block_table_ptrs + group).to(tl.pointer_type(tl.int32))
    stride = tl.load(block_table_strides + group)
    bs = tl.load(block_sizes + group).to(tl.int64)
    for i in range(start, end, TRITON_BLOCK_SIZE):
        offs = i + tl.arange(0, TRITON_BLOCK_SIZE)
        mask = offs < end
        p = tl.load(pos + offs, mask=mask, other=0).to(tl.int64)
        if CP_SIZE == 1:
            idx = p // bs
            off = p % bs
            mine = p >= 0
        else:
            vo = p % (bs * CP_SIZE)
            idx = p // (bs * CP_SIZE)
            mine = (vo // CP_INTERLEAVE) % CP_SIZE == cp_rank
            off = (vo // (CP_SIZE * CP_INTERLEAVE)) * CP_INTERLEAVE + vo % CP_INTERLEAVE
        ok = mask & mine & enabled & (row >= 0) & (idx < stride)
        blk = tl.load(table + row.to(tl.int64) * stride + idx, mask=ok, other=0).to(tl.int64)
        slot = tl.where(ok, blk * bs + off, PAD_ID)
        tl.store(out + offs, slot.to(tl.uint32), mask=mask)  # BUG: an int64 buffer reads PAD as 2^32 - 1

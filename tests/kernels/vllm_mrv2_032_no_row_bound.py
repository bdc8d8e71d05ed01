"""The twin of ``vllm_mrv2_032_abi.py`` (``vllm-mrv2-0.32``) without a row bound: it reads ``table[row][p // B]`` past the row's end.

Parameter list and launch as those releases' ``BlockTables.compute_slot_mappings`` (grid
``(num_groups, num_reqs + 1)``, one launch with ``CP_SIZE`` = the DCP size, physical tables
through ``idx_mapping`` (-1: a dummy request, PAD), per-group ``slot_mapping_enabled`` and
``dcp_sharded`` flags, int64 output); our own plain body.
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
    slot_mapping_enabled,
    dcp_sharded,
    slot_mappings_ptr,
    slot_mappings_stride,
    cp_rank,
    CP_SIZE: tl.constexpr,
    CP_INTERLEAVE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TRITON_BLOCK_SIZE: tl.constexpr,
):
    group = tl.program_id(0)
    batch_idx = tl.program_id(1)
    out = slot_mappings_ptr + group.to(tl.int64) * slot_mappings_stride
    if batch_idx == tl.num_programs(1) - 1:
        pad_from = tl.load(query_start_loc + batch_idx)
        for i in range(pad_from, max_num_tokens, TRITON_BLOCK_SIZE):
            offs = i + tl.arange(0, TRITON_BLOCK_SIZE)
            tl.store(out + offs, tl.full((TRITON_BLOCK_SIZE,), PAD_ID, tl.int64), mask=offs < max_num_tokens)
        return
    start = tl.load(query_start_loc + batch_idx)
    end = tl.load(query_start_loc + batch_idx + 1)
    row = tl.load(idx_mapping + batch_idx).to(tl.int64)
    enabled = tl.load(slot_mapping_enabled + group) != 0
    sharded = tl.load(dcp_sharded + group) != 0
    table = tl.load(block_table_ptrs + group).to(tl.pointer_type(tl.int32))
    stride = tl.load(block_table_strides + group)
    bs = tl.load(block_sizes + group).to(tl.int64)
    for i in range(start, end, TRITON_BLOCK_SIZE):
        offs = i + tl.arange(0, TRITON_BLOCK_SIZE)
        mask = offs < end
        p = tl.load(pos + offs, mask=mask, other=0).to(tl.int64)
        chunk = p // CP_INTERLEAVE
        mine = (chunk % CP_SIZE == cp_rank) | ~sharded
        local = tl.where(sharded, (chunk // CP_SIZE) * CP_INTERLEAVE + p % CP_INTERLEAVE, p)
        idx = local // bs
        ok = mask & mine & enabled & (row >= 0)
        blk = tl.load(table + row * stride + idx, mask=ok, other=0).to(tl.int64)
        slot = tl.where(ok, blk * bs + local % bs, PAD_ID)
        tl.store(out + offs, slot, mask=mask)

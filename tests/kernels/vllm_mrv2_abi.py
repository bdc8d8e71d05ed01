"""A slot-mapping kernel in cpsim's own MRV2 model (ABI ``cpsim-mrv2``; no vLLM release has it), for cpsim's tests.

Same parameter list and launch as cpsim's model of MRV2 (``cpsim.kernels.mrv2``)
(grid ``(num_groups, num_reqs + 1)``, int64 output, kernel-block tables bounded by
``num_blocks``, a CP size per group, padding from ``query_start_loc[num_reqs]``),
plus the optional ``is_padding`` input; our own plain body, one statement per rule
so that the tests can break exactly one of them.
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
    num_blocks_ptr,
    num_blocks_stride,
    block_sizes,
    kernel_block_sizes,
    group_cp_sizes,
    slot_mappings_ptr,
    slot_mappings_stride,
    cp_rank,
    CP_SIZE: tl.constexpr,
    CP_INTERLEAVE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TRITON_BLOCK_SIZE: tl.constexpr,
    is_padding,
):
    group = tl.program_id(0)
    batch_idx = tl.program_id(1)
    out = slot_mappings_ptr + group.to(tl.int64) * slot_mappings_stride
    if batch_idx == tl.num_programs(1) - 1:
        tail = tl.load(query_start_loc + batch_idx)
        for i in range(tail, max_num_tokens, TRITON_BLOCK_SIZE):
            offs = i + tl.arange(0, TRITON_BLOCK_SIZE)
            tl.store(out + offs, tl.full((TRITON_BLOCK_SIZE,), PAD_ID, tl.int64), mask=offs < max_num_tokens)
        return
    row = tl.load(idx_mapping + batch_idx)
    start = tl.load(query_start_loc + batch_idx)
    end = tl.load(query_start_loc + batch_idx + 1)
    table = tl.load(block_table_ptrs + group).to(tl.pointer_type(tl.int32))
    stride = tl.load(block_table_strides + group)
    bs = tl.load(block_sizes + group).to(tl.int64)
    kbs = tl.load(kernel_block_sizes + group).to(tl.int64)
    gcp = tl.load(group_cp_sizes + group).to(tl.int64)
    shard = cp_rank % gcp
    live = tl.load(num_blocks_ptr + group * num_blocks_stride + tl.maximum(row, 0))
    for i in range(start, end, TRITON_BLOCK_SIZE):
        offs = i + tl.arange(0, TRITON_BLOCK_SIZE)
        mask = offs < end
        p = tl.load(pos + offs, mask=mask, other=0).to(tl.int64)
        span = bs * gcp
        vb = p // span
        vo = p % span
        mine = (vo // CP_INTERLEAVE) % gcp == shard
        local = vb * bs + (vo // (gcp * CP_INTERLEAVE)) * CP_INTERLEAVE + vo % CP_INTERLEAVE
        idx = local // kbs
        off = local % kbs
        pad = tl.load(is_padding + offs, mask=mask, other=0) != 0
        ok = mask & mine & (row >= 0) & (idx < live) & ~pad
        blk = tl.load(table + row.to(tl.int64) * stride + idx, mask=ok, other=0).to(tl.int64)
        slot = tl.where(ok, blk * kbs + off, PAD_ID)
        tl.store(out + offs, slot, mask=mask)

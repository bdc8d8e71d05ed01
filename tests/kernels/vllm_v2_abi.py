"""A slot-mapping kernel in upstream vLLM's MRV2 ABI, written for cpsim's tests.

Same parameter list and launch as ``vllm/v1/worker/gpu/block_table.py``
(grid ``(num_groups, num_reqs + 1)``, int64 output, padding from ``query_start_loc[num_reqs]``: the host's ``num_tokens`` is the graph-padded count);
our own plain body.
"""

import triton
import triton.language as tl


@triton.jit
def _compute_slot_mappings_kernel(
    num_tokens,
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
):
    group = tl.program_id(0)
    batch_idx = tl.program_id(1)
    out = slot_mappings_ptr + group.to(tl.int64) * slot_mappings_stride
    if batch_idx == tl.num_programs(1) - 1:
        for i in range(tl.load(query_start_loc + batch_idx), max_num_tokens, TRITON_BLOCK_SIZE):
            offs = i + tl.arange(0, TRITON_BLOCK_SIZE)
            tl.store(out + offs, tl.full((TRITON_BLOCK_SIZE,), PAD_ID, tl.int64), mask=offs < max_num_tokens)
        return
    start = tl.load(query_start_loc + batch_idx)
    end = tl.load(query_start_loc + batch_idx + 1)
    row = tl.load(idx_mapping + batch_idx)
    table = tl.load(block_table_ptrs + group).to(tl.pointer_type(tl.int32))
    stride = tl.load(block_table_strides + group)
    bs = tl.load(block_sizes + group).to(tl.int64)
    for i in range(start, end, TRITON_BLOCK_SIZE):
        offs = i + tl.arange(0, TRITON_BLOCK_SIZE)
        mask = offs < end
        p = tl.load(pos + offs, mask=mask, other=0).to(tl.int64)
        span = bs * CP_SIZE
        vo = p % span
        mine = (vo // CP_INTERLEAVE) % CP_SIZE == cp_rank
        idx = p // span
        off = (vo // (CP_SIZE * CP_INTERLEAVE)) * CP_INTERLEAVE + vo % CP_INTERLEAVE
        ok = mask & mine & (row >= 0) & (idx < stride)
        blk = tl.load(table + row.to(tl.int64) * stride + idx, mask=ok, other=0).to(tl.int64)
        slot = tl.where(ok, blk * bs + off, PAD_ID)
        tl.store(out + offs, slot, mask=mask)

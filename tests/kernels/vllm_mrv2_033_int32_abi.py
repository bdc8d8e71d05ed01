"""Our own twin of vLLM 0.33.0's MRV2 slot defect, in that release's ABI (``vllm-mrv2-0.32``).

``vllm_mrv2_032_abi.py`` with one change: the block id is loaded as int32 and multiplied by the
block size in int32, as 0.33.0's ``_compute_slot_mappings_kernel`` does (docs/UPSTREAM_ABIS.md),
so a slot past 2^31 wraps although the output is int64. Correct below 2^31 slots.
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
        ok = mask & mine & enabled & (row >= 0) & (idx < stride)
        blk = tl.load(table + row * stride + idx, mask=ok, other=0)  # int32, not widened
        # BUG: the product is int32 and wraps past 2^31 before the int64 store.
        slot = tl.where(ok, (blk * bs.to(tl.int32) + (local % bs).to(tl.int32)).to(tl.int64), PAD_ID)
        tl.store(out + offs, slot, mask=mask)

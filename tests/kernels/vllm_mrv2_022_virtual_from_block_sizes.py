"""Twin of a real vLLM 0.22-0.28 MRV2 defect, in that ABI (``vllm-mrv2-0.22``), written for cpsim's tests.

Those releases' ``BlockTables`` hands the kernel kernel-block tables and ``block_sizes`` = the kernel
block b (``block_sizes_tensor`` from ``kernel_block_sizes``), and the kernel builds the DCP virtual
block as ``block_sizes x CP_SIZE``: b x CP instead of B x CP. Where the interleave does not divide b
(b = 64, I = 128) ownership is decided inside the wrong span. Our own body in the released signature;
under cpsim's adapter for the ABI (kernel-block tables, b) it fails ``hybrid-interleave``. Before the
adapter handed these releases' kernels physical tables and B, so it passed.
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
        span = bs * CP_SIZE  # the defect: the virtual block from the block size the host passes (b)
        vo = p % span
        mine = (vo // CP_INTERLEAVE) % CP_SIZE == cp_rank
        idx = p // span
        off = (vo // (CP_SIZE * CP_INTERLEAVE)) * CP_INTERLEAVE + vo % CP_INTERLEAVE
        ok = mask & mine & (row >= 0) & (idx < stride)
        blk = tl.load(table + row.to(tl.int64) * stride + idx, mask=ok, other=0).to(tl.int64)
        slot = tl.where(ok, blk * bs + off, PAD_ID)
        tl.store(out + offs, slot, mask=mask)

"""v2 slot-mapping kernel in cpsim's own MRV2 model (ABI ``cpsim-mrv2``; no vLLM release has this signature).

One launch for all groups, grid ``(num_groups, num_reqs + 1)``; the last program
of each group pads the tail from ``query_start_loc[num_reqs]``. Each group has its
own CP size ``g`` (``group_cp_sizes``): the rank's shard is ``cp_rank % g`` and the
virtual block is ``B * g``, so one launch serves sharded, partially replicated and
replicated groups. Tables hold kernel-block ids; ``num_blocks[group][row]`` bounds
the live part of a row, and a token whose kernel-block index is not below it gets
PAD (as does a token flagged in the optional ``is_padding``).

Written for triton-ascend as well as Triton (docs/ASCEND_CHECK.md, "Rules a kernel for triton-ascend follows"): the table pointer is one
scalar per program (no tensor of pointers), block ids come from masked direct
loads (no ``tl.gather``, which rejects int32 there), position arithmetic is int32
(positions are below ``max_model_len`` < 2^31) with int64 only for the final slot,
and remainders are written as multiply-subtract instead of ``%``.

``is_circular`` (a sliding-window ring: one block per row) and ``num_tokens_padded``
(read only by the stale-tail fault) are cpsim additions with defaults, so the
kernel still matches the upstream parameter list. ``FAULT`` bits (named in
``cpsim.kernels``) compile in the catalogue's deviations.
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
    is_padding=None,
    is_circular=None,
    num_tokens_padded=0,
    FAULT: tl.constexpr = 0,
):
    group = tl.program_id(0)
    batch_idx = tl.program_id(1)
    out_ptr = slot_mappings_ptr + group.to(tl.int64) * slot_mappings_stride
    if batch_idx == tl.num_programs(1) - 1:
        start = tl.load(query_start_loc + batch_idx)
        if FAULT & 1:  # stale-tail
            start = num_tokens_padded
        for i in range(start, max_num_tokens, TRITON_BLOCK_SIZE):
            offs = i + tl.arange(0, TRITON_BLOCK_SIZE)
            tl.store(out_ptr + offs, tl.full((TRITON_BLOCK_SIZE,), PAD_ID, tl.int64).to(out_ptr.dtype.element_ty),
                     mask=offs < max_num_tokens)
        return

    row = tl.load(idx_mapping + batch_idx)
    start = tl.load(query_start_loc + batch_idx)
    end = tl.load(query_start_loc + batch_idx + 1)
    if row < 0:  # a dummy / graph-padding request: its row is never read, its tokens get PAD (vLLM 0.31+)
        for i in range(start, end, TRITON_BLOCK_SIZE):
            offs = i + tl.arange(0, TRITON_BLOCK_SIZE)
            tl.store(out_ptr + offs, tl.full((TRITON_BLOCK_SIZE,), PAD_ID, tl.int64).to(out_ptr.dtype.element_ty),
                     mask=offs < end)
        return

    # Per-group scalars: one scalar table pointer per program (no pointer vectors).
    table_ptr = tl.load(block_table_ptrs + group).to(tl.pointer_type(tl.int32))
    stride = tl.load(block_table_strides + group)
    row_ptr = table_ptr + row.to(tl.int64) * stride
    B = tl.load(block_sizes + group).to(tl.int32)
    b = tl.load(kernel_block_sizes + group).to(tl.int32)
    if FAULT & 512:  # kernel-block-size-ignored
        b = B
    g = tl.load(group_cp_sizes + group).to(tl.int32)
    if FAULT & 64:  # group-cp-size-ignored
        g = g + (g > 1).to(tl.int32) * (CP_SIZE - g)
    live = tl.load(num_blocks_ptr + group.to(tl.int64) * num_blocks_stride + row).to(tl.int32)
    shard = cp_rank - (cp_rank // g) * g
    if FAULT & 128:  # shard-rank-not-modulo
        shard = cp_rank + 0 * g
    V = B * g
    if FAULT & 256:  # virtual-block-uses-world-size
        V = B * CP_SIZE
    ROUND = g * CP_INTERLEAVE
    circular = False
    if is_circular is not None:
        circular = tl.load(is_circular + group) != 0

    for tile in range(start, end, TRITON_BLOCK_SIZE):
        offs = tile + tl.arange(0, TRITON_BLOCK_SIZE)
        mask = offs < end
        p = tl.load(pos + offs, mask=mask, other=0).to(tl.int32)
        vb = p // V
        vo = p - vb * V
        rnd = vo // CP_INTERLEAVE
        owner = rnd - (rnd // g) * g
        # Rank-local index: whole virtual blocks, then this shard's interleaved share.
        local = vb * B + (vo // ROUND) * CP_INTERLEAVE + (vo - rnd * CP_INTERLEAVE)
        kb = local // b
        if circular:
            kb = kb * 0
            local = p - (p // b) * b
        ko = local - (local // b) * b
        valid = mask & (owner == shard) & (kb < live) & (p >= 0)
        if is_padding is not None:
            if not (FAULT & 1024):  # is-padding-ignored
                flagged = tl.load(is_padding + offs, mask=mask, other=0)
                valid = valid & (flagged == 0)
        blk = tl.load(row_ptr + kb, mask=valid, other=0)
        slot = tl.where(valid, blk.to(tl.int64) * b + ko, PAD_ID)
        tl.store(out_ptr + offs, slot.to(out_ptr.dtype.element_ty), mask=mask)

"""v2 multi-group slot-mapping kernel (vLLM ``BlockTables`` semantics, Ascend flavour).

One launch for all groups, grid ``(num_groups, num_reqs + 1)``. Tables are
physical (entries of ``block_sizes[g]`` slots) and addressed by
``idx_mapping[batch_idx]``; a dummy request (``-1``) is never dereferenced and its
tokens, if it schedules any, are PAD.
Per-group device arrays say whether a group is slot-mapped at all
(``slot_mapping_enabled``), how many CP ranks it is sharded over
(``group_cp_sizes``: ``CP_SIZE`` or 1) and whether its table is a circular tail.
"""

import triton
import triton.language as tl

from cpsim.kernels._common import lookup_slots, pad_tail


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
    BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
    slot_mapping_enabled,
    group_cp_sizes,
    is_circular,
    FAULT: tl.constexpr = 0,
    POS_INT32: tl.constexpr = False,
):
    group = tl.program_id(0)
    batch_idx = tl.program_id(1)
    out_ptr = slot_mappings_ptr + group.to(tl.int64) * slot_mappings_stride
    if batch_idx == tl.num_programs(1) - 1:
        start = tl.load(query_start_loc + batch_idx)
        if FAULT & 1:
            start = num_tokens
        pad_tail(out_ptr, start, max_num_tokens, PAD_ID, TRITON_BLOCK_SIZE)
        return

    row = tl.load(idx_mapping + batch_idx)
    start = tl.load(query_start_loc + batch_idx)
    end = tl.load(query_start_loc + batch_idx + 1)
    if row < 0:  # dummy request: no table row; tokens it schedules (graph padding) get PAD, as vLLM 0.31+
        pad_tail(out_ptr, start, end, PAD_ID, TRITON_BLOCK_SIZE)
        return
    enabled = tl.load(slot_mapping_enabled + group) != 0
    sharded = tl.load(group_cp_sizes + group) > 1
    if FAULT & 16:  # cp-applied-to-unsharded-groups
        sharded = CP_SIZE > 1
    circular = tl.load(is_circular + group) != 0
    table_ptr = tl.load(block_table_ptrs + group).to(tl.pointer_type(tl.int32))
    stride = tl.load(block_table_strides + group)
    block_size = tl.load(block_sizes + group)
    if not POS_INT32:  # int32 position math when the paths prove it exact (see triton_v1)
        block_size = block_size.to(tl.int64)
    row_ptr = table_ptr + row.to(tl.int64) * stride
    for tile in range(start, end, TRITON_BLOCK_SIZE):
        offs = tile + tl.arange(0, TRITON_BLOCK_SIZE)
        mask = offs < end
        p = tl.load(pos + offs, mask=mask, other=0)
        p = p.to(tl.int32) if POS_INT32 else p.to(tl.int64)
        virtual = block_size * CP_SIZE
        if sharded:
            # Virtual block of B * N positions, one physical block per rank
            # holding that rank's interleaved share densely.
            # Remainders as multiply-subtract (Ascend's vector unit has no integer remainder).
            vo = p - (p // virtual) * virtual
            chunk = vo // CP_INTERLEAVE
            local = chunk - (chunk // CP_SIZE) * CP_SIZE == cp_rank
        else:
            vo = p
            local = p >= 0
        valid = mask & local & enabled
        slot = tl.full((TRITON_BLOCK_SIZE,), PAD_ID, tl.int64)
        # A tile this rank owns nothing of skips the table walk (fewer interpreted ops; same result).
        if tl.max(valid.to(tl.int32), 0) > 0:
            if sharded:
                k = p // virtual
                o = (vo // (CP_SIZE * CP_INTERLEAVE)) * CP_INTERLEAVE + (vo - (vo // CP_INTERLEAVE) * CP_INTERLEAVE)
            else:
                k = p // block_size
                o = p - k * block_size
            if circular:
                k = k * 0
            slot = lookup_slots(row_ptr, stride, k, o, valid, block_size, PAD_ID, BLOCK_TABLE_WINDOW_SIZE, FAULT)
        tl.store(out_ptr + offs, slot.to(out_ptr.dtype.element_ty), mask=mask)

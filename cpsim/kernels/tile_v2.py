"""Tile-parallel v2 multi-group kernel (vLLM ``BlockTables`` semantics, Ascend flavour).

Same arguments as ``triton_v2._compute_slot_mappings_kernel`` plus ``num_reqs``,
minus the block-table window (every token reads its own entry). One program per
``TRITON_BLOCK_SIZE`` buffer entries handles every group as one
``[GROUP_BLOCK, TILE]`` block, so positions, the request search and
``idx_mapping`` are read once for all groups and all table loads are in flight
together. Grid: ``(cdiv(max_num_tokens, TRITON_BLOCK_SIZE),)``. ``POW2`` (the caller
checks every block size and ``CP_SIZE`` are powers of two below 2**24) turns the
runtime divisions by block sizes into shifts.

Dummy requests (``idx_mapping == -1``) are never dereferenced; their tokens (none
in a valid batch) are left unwritten, as the per-request kernel leaves them.
"""

import triton
import triton.language as tl

from cpsim.kernels._common import gather_i32
from cpsim.kernels._tile import find_requests, log2_pow2, read_blocks, slot_of, write_mask


@triton.jit(do_not_specialize=["num_tokens", "num_reqs", "cp_rank"])
def _tile_slot_mappings_kernel(
    num_tokens,
    max_num_tokens,
    num_reqs,
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
    slot_mapping_enabled,
    group_cp_sizes,
    is_circular,
    NUM_GROUPS: tl.constexpr,
    GROUP_BLOCK: tl.constexpr,
    REQ_BLOCK: tl.constexpr,
    FAULT: tl.constexpr = 0,
    POS_INT32: tl.constexpr = True,
    POW2: tl.constexpr = False,
):
    t = tl.program_id(0) * TRITON_BLOCK_SIZE + tl.arange(0, TRITON_BLOCK_SIZE)
    req, actual = find_requests(query_start_loc, num_reqs, t, TRITON_BLOCK_SIZE, REQ_BLOCK)
    ridx = tl.arange(0, REQ_BLOCK)
    rows = tl.load(idx_mapping + ridx, mask=ridx < num_reqs, other=-1)
    row = gather_i32(rows, req)
    tok = (t < actual) & (t < max_num_tokens)
    p = tl.load(pos + t, mask=tok, other=0)
    if POS_INT32:
        p = p.to(tl.int32)

    g = tl.arange(0, GROUP_BLOCK)
    has = g < NUM_GROUPS
    table = tl.load(block_table_ptrs + g, mask=has, other=0).to(tl.pointer_type(tl.int32))
    stride = tl.load(block_table_strides + g, mask=has, other=0)
    bs = tl.load(block_sizes + g, mask=has, other=1)
    if not POS_INT32:
        bs = bs.to(tl.int64)
    enabled = tl.load(slot_mapping_enabled + g, mask=has, other=0) != 0
    sharded = tl.load(group_cp_sizes + g, mask=has, other=1) > 1
    if FAULT & 16:  # cp-applied-to-unsharded-groups
        if CP_SIZE > 1:
            sharded = g >= 0
        else:
            sharded = g < 0
    circular = tl.load(is_circular + g, mask=has, other=0) != 0

    p2 = p[None, :]
    b2 = bs[:, None]
    sh = sharded[:, None]
    virtual = b2 * CP_SIZE
    if POW2:  # block sizes and CP size are powers of two: shifts and masks, no division
        lb = log2_pow2(bs)[:, None]
        vo = p2 & (virtual - 1)
        k_sharded = (p2 >> lb) // CP_SIZE
        k_plain = p2 >> lb
        o_plain = p2 & (b2 - 1)
    else:
        vo = p2 % virtual
        k_sharded = p2 // virtual
        k_plain = p2 // b2
        o_plain = p2 % b2
    lo = (vo // (CP_SIZE * CP_INTERLEAVE)) * CP_INTERLEAVE + vo % CP_INTERLEAVE
    local = tl.where(sh, (vo // CP_INTERLEAVE) % CP_SIZE == cp_rank, p2 >= 0)
    k = tl.where(sh, k_sharded, k_plain)
    o = tl.where(sh, lo, o_plain)
    k = tl.where(circular[:, None], 0, k)
    live = tok & (row >= 0)
    valid = (has & enabled)[:, None] & local & live[None, :]
    ptrs = table[:, None] + (row.to(tl.int64)[None, :] * stride[:, None])
    blk = read_blocks(ptrs, stride[:, None], k, valid, FAULT)
    slot = tl.where(valid, slot_of(blk, b2, o, FAULT), PAD_ID)
    out = slot_mappings_ptr + g.to(tl.int64)[:, None] * slot_mappings_stride + t[None, :]
    wm = write_mask(t, max_num_tokens, actual, num_tokens, FAULT) & ((t >= actual) | (row >= 0))
    tl.store(out, slot.to(slot_mappings_ptr.dtype.element_ty), mask=has[:, None] & wm[None, :])

"""Triton helpers shared by the built-in kernels."""

import triton
import triton.language as tl

INT32_BIG = tl.constexpr(2147483647)  # globals read inside @jit must be constexpr


@triton.jit
def split16(x):
    """int32 ``x`` as two float32 halves, both exact: ``x >> 16`` in [-2**15, 2**15) and ``x & 0xFFFF``."""
    return (x >> 16).to(tl.float32), (x & 0xFFFF).to(tl.float32)


@triton.jit
def gather_split(hi, lo, idx):
    """``x[idx]`` of the int32 ``x`` that ``split16`` split, exactly for every int32 value.

    triton-ascend's ``tl.gather`` takes float / int8 tensors only; a single float32
    gather rounds ids above 2**24 (the ``fp32-block-gather`` bug), two 16-bit halves
    do not. Recombined with a shift, so negative ids (-1 rows) come back too.
    """
    h = tl.gather(hi, idx, 0).to(tl.int32)
    lw = tl.gather(lo, idx, 0).to(tl.int32)
    return (h << 16) | lw


@triton.jit
def gather_i32(x, idx):
    """``x[idx]`` for an int32 tensor ``x``, exact, through float32 gathers only."""
    hi, lo = split16(x)
    return gather_split(hi, lo, idx)


@triton.jit
def lookup_blocks(row_ptr, stride, k, valid, WINDOW: tl.constexpr, FAULT: tl.constexpr):
    """Block ids at table indices ``k`` of one row, staged through a bounded window.

    The window starts at the smallest index the tile needs, so consecutive positions
    fit in ``WINDOW`` entries; anything beyond it (only layouts that break the
    global rule produce that) is read from the table directly. Loads never pass
    the row's stride.
    """
    if FAULT & 2:  # fixed-table-window: one 4096-entry window from index 0
        offs = tl.arange(0, 4096)
        win = tl.load(row_ptr + offs, mask=offs < stride, other=0)
        idx = tl.minimum(tl.where(valid, k, 0), 4095).to(tl.int32)
        if FAULT & 4:  # fp32-block-gather
            blk = tl.gather(win.to(tl.float32), idx, 0).to(tl.int32)
        else:
            blk = gather_i32(win, idx)
    else:
        base = tl.min(tl.where(valid, k, INT32_BIG), 0)
        base = tl.where(base == INT32_BIG, 0, base)
        offs = base + tl.arange(0, WINDOW)
        win = tl.load(row_ptr + offs, mask=offs < stride, other=0)
        rel = k - base
        near = valid & (rel < WINDOW)
        idx = tl.where(near, rel, 0).to(tl.int32)
        if FAULT & 4:  # fp32-block-gather: ids above 2**24 round
            blk = tl.gather(win.to(tl.float32), idx, 0).to(tl.int32)
        else:
            blk = gather_i32(win, idx)
        far = valid & (rel >= WINDOW)
        if tl.max(far.to(tl.int32), 0) > 0:  # rare: skipping it saves interpreted ops
            direct = tl.load(row_ptr + k, mask=far & (k < stride), other=0)
            blk = tl.where(far, direct, blk)
    return blk


@triton.jit
def make_slot(blk, block_size, o, FAULT: tl.constexpr):
    if FAULT & 8:  # int32-slot-overflow
        return blk * block_size.to(tl.int32) + o.to(tl.int32)
    return blk.to(tl.int64) * block_size + o


@triton.jit
def lookup_slots(row_ptr, stride, k, o, valid, block_size, PAD_ID: tl.constexpr, WINDOW: tl.constexpr,
                 FAULT: tl.constexpr):
    """int64 slots of one tile (table entry ``k``, offset ``o``), PAD where not ``valid`` or past the row's end
    (a tail group narrower than the sequence: SPEC §2.4)."""
    valid = valid & (k < stride)
    blk = lookup_blocks(row_ptr, stride, k, valid, WINDOW, FAULT)
    return tl.where(valid, make_slot(blk, block_size, o, FAULT), PAD_ID).to(tl.int64)


@triton.jit
def pad_tail(out_ptr, start, max_num_tokens, PAD_ID: tl.constexpr, TILE: tl.constexpr):
    for i in range(start, max_num_tokens, TILE):
        offs = i + tl.arange(0, TILE)
        tl.store(out_ptr + offs, tl.full((TILE,), PAD_ID, tl.int64).to(out_ptr.dtype.element_ty),
                 mask=offs < max_num_tokens)

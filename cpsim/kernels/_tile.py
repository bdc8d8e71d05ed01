"""Triton helpers of the tile-parallel kernels.

A tile kernel runs one program per ``TILE`` consecutive entries of the slot
buffer, so the grid depends on ``max_num_tokens`` only. Each program finds the
request of every token by a binary search in ``query_start_loc``, held in
registers (one vector load per program), and reads one block-table entry per
token. Padding entries are written by the same programs.
"""

import triton
import triton.language as tl

from cpsim.kernels._common import gather_split, split16

INT32_BIG = tl.constexpr(2147483647)


@triton.jit
def find_requests(qsl_ptr, num_reqs, t, TILE: tl.constexpr, REQ_BLOCK: tl.constexpr):
    # t must be program_id(0) * TILE + arange(0, TILE).
    """(request of each token, query_start_loc[num_reqs]) for the tile of this program."""
    return find_requests_from(qsl_ptr, num_reqs, tl.program_id(0) * TILE, t, TILE, REQ_BLOCK)


@triton.jit
def find_requests_from(qsl_ptr, num_reqs, t0, t, TILE: tl.constexpr, REQ_BLOCK: tl.constexpr):
    # t must be t0 + arange(0, TILE).
    """(request of each token, query_start_loc[num_reqs]).

    The request of token ``t`` is the largest ``r < num_reqs`` with
    ``qsl[r] <= t`` (empty requests share their start with the next one and lose).
    ``query_start_loc`` is held in registers (one vector load); the tile's first
    and last real tokens bound the search by two reductions, so a tile inside one
    request (prefill) skips the per-token search.
    """
    idx = tl.arange(0, REQ_BLOCK)
    q = tl.load(qsl_ptr + idx, mask=idx <= num_reqs, other=INT32_BIG)
    actual = tl.load(qsl_ptr + num_reqs)
    inner = tl.where((idx >= 1) & (idx < num_reqs), q, INT32_BIG)
    t1 = tl.minimum(t0 + TILE - 1, actual - 1)
    r0 = tl.sum((inner <= t0).to(tl.int32), 0)
    r1 = tl.sum((inner <= t1).to(tl.int32), 0)
    r1 = tl.maximum(r1, r0)
    lo = tl.zeros([TILE], tl.int32) + r0
    hi = tl.zeros([TILE], tl.int32) + r1
    width = r1 - r0
    q_hi, q_lo = split16(q)  # int32 gathers go through float32 halves (triton-ascend; exact)
    while width > 0:
        mid = (lo + hi + 1) // 2
        go = gather_split(q_hi, q_lo, mid) <= t
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid - 1)
        width = width // 2
    return lo, actual


@triton.jit
def read_blocks(ptrs, stride, k, valid, FAULT: tl.constexpr):
    """Block id at table index ``k`` (0 past the row's stride), one load per token.

    FAULT bits reproduce the per-request kernels' bugs: 2 = only the first 4096
    entries of a row are reachable, 4 = ids pass through float32.
    """
    if FAULT & 2:
        k = tl.minimum(k, 4095)
    blk = tl.load(ptrs + k, mask=valid & (k < stride), other=0)
    if FAULT & 4:
        blk = blk.to(tl.float32).to(tl.int32)
    return blk


@triton.jit
def slot_of(blk, block_size, o, FAULT: tl.constexpr):
    """``blk * block_size + o`` in int64 (FAULT 8: in int32, as the overflow bug does)."""
    if FAULT & 8:  # wraps in int32 first, then widens: the value the bug stores
        slot = (blk * block_size.to(tl.int32) + o.to(tl.int32)).to(tl.int64)
    else:
        slot = blk.to(tl.int64) * block_size.to(tl.int64) + o.to(tl.int64)
    return slot


@triton.jit
def write_mask(t, max_num_tokens, actual, num_tokens, FAULT: tl.constexpr):
    """Entries this launch writes: all of the buffer (FAULT 1: not [actual, num_tokens))."""
    m = t < max_num_tokens
    if FAULT & 1:
        m = m & ((t < actual) | (t >= num_tokens))
    return m


@triton.jit
def log2_pow2(x):
    """Exact log2 of a power of two (int32 < 2**24), from the float exponent bits."""
    return (x.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127

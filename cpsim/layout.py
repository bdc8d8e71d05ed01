"""The CP KV-cache layout math (SPEC §2), in one place.

Every function works elementwise on int64 torch tensors, numpy arrays or plain ints, so the
reference kernel, the allocator, the coordinator and the docs all use the same
formulas. Nothing here knows about kernels, paths or processes.

Two views of ownership exist and they must agree for valid configurations:

* the *global rule*: position ``p`` lives on rank ``(p // I) % N``;
* the *virtual-block formula* the kernels use: split ``p`` by ``V = B * N`` into
  a virtual block ``vb`` and offset ``vo``; the owner is ``(vo // I) % N`` and the
  rank-local offset inside the physical block is
  ``(vo // (N * I)) * I + vo % I``.

They coincide exactly when ``I`` divides ``B`` (then ``N * I`` divides ``V``, so a
virtual block holds whole interleave rounds).
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Union

import numpy as np

if TYPE_CHECKING:  # torch is costly to import (seconds): `cpsim --help` and input errors answer without it
    import torch

PAD_SLOT_ID = -1
POISON = -7777  # written into output buffers before every launch; never a slot nor PAD
GUARD = -7919   # held by the guard entries around every output row; a kernel never writes there
TABLE_GUARD_GAP = 7  # guard block id = first id past the cache + this gap (see table_guard_id)

IntOrTensor = Union[int, "torch.Tensor", np.ndarray]


def _is_tensor(x) -> bool:
    """``x`` is a torch tensor; without torch imported nothing is one (this module never imports it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _clip(x: IntOrTensor, lo: int, hi: int) -> IntOrTensor:
    if _is_tensor(x):
        return x.clamp(lo, hi)
    if isinstance(x, np.ndarray):
        return np.clip(x, lo, hi)
    return min(max(x, lo), hi)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def shard_rank(rank: int, group_cp_size: int) -> int:
    """Which shard of a group of CP size ``g`` rank ``rank`` holds: ``rank % g``.

    Every formula below takes ``world = g`` and this shard rank, so a partially
    replicated group (``1 < g < N``) is ``N // g`` independent copies of a group
    sharded over ``g`` ranks; ``g = 1`` is shard 0 everywhere (replicated).
    """
    return rank % max(group_cp_size, 1)


def replica_sets(world: int, group_cp_size: int) -> list[range]:
    """The sets of ``g`` consecutive ranks that each hold one whole copy of the group."""
    g = max(group_cp_size, 1)
    return [range(k, k + g) for k in range(0, world, g)]


def owner_rank(pos: IntOrTensor, world: int, interleave: int) -> IntOrTensor:
    """Global rule: which CP rank stores the K/V of position ``pos``."""
    return (pos // interleave) % world


def owned_before(pos: IntOrTensor, rank: int, world: int, interleave: int) -> IntOrTensor:
    """Number of positions ``q < pos`` that ``rank`` owns under the global rule.

    A full round of ``N * I`` positions gives every rank ``I`` of them; inside the
    last, partial round rank ``r`` owns the window ``[r*I, (r+1)*I)``.
    """
    rnd = world * interleave
    full = pos // rnd
    rest = pos - full * rnd - rank * interleave
    return full * interleave + _clip(rest, 0, interleave)


def virtual_split(pos: IntOrTensor, block_size: int, world: int):
    """(virtual block, offset inside it) for virtual block size ``B * N``."""
    virtual = block_size * world
    return pos // virtual, pos % virtual


def virtual_owner(vo: IntOrTensor, world: int, interleave: int) -> IntOrTensor:
    return (vo // interleave) % world


def virtual_local_offset(vo: IntOrTensor, world: int, interleave: int) -> IntOrTensor:
    return (vo // (world * interleave)) * interleave + vo % interleave


def table_index(pos: IntOrTensor, block_size: int, kernel_block_size: int,
                world: int, interleave: int):
    """Logical table index ``k``, kernel-block offset ``o`` and owner of each position.

    ``k`` indexes the v1 *logical* table, whose entries are kernel blocks of size
    ``b`` (a physical block ``q`` expands to ``q*BPK .. q*BPK+BPK-1``). With
    ``world == 1`` every rank owns every position; the owner returned is 0.
    """
    bpk = block_size // kernel_block_size
    if world == 1:
        return pos // kernel_block_size, pos % kernel_block_size, pos * 0
    vb, vo = virtual_split(pos, block_size, world)
    owner = virtual_owner(vo, world, interleave)
    lo = virtual_local_offset(vo, world, interleave)
    return vb * bpk + lo // kernel_block_size, lo % kernel_block_size, owner


def local_index(pos: "torch.Tensor", block_size: int, world: int, interleave: int):
    """Rank-local token index (``vb * B + local offset``) under the virtual-block formula."""
    if world == 1:
        return pos
    vb, vo = virtual_split(pos, block_size, world)
    return vb * block_size + virtual_local_offset(vo, world, interleave)


def blocks_touched(seq_len: int, rank: int, block_size: int, world: int,
                   interleave: int) -> int:
    """Physical blocks rank ``rank`` needs for positions ``[0, seq_len)``.

    Counted by the virtual-block formula (one block per virtual block in which the
    rank owns a position), so it is also right for configurations that break the
    global rule and are run on purpose. Equals ``cdiv(owned_before(seq_len), B)``
    when ``I`` divides ``B``.
    """
    if seq_len <= 0:
        return 0
    if world == 1:
        return cdiv(seq_len, block_size)
    if block_size % interleave:
        # Invalid layout run on purpose: the local offset can pass B, so scan.
        pos = np.arange(seq_len, dtype=np.int64)
        vb, vo = virtual_split(pos, block_size, world)
        mine = (virtual_owner(vo, world, interleave) == rank)
        phys = vb + virtual_local_offset(vo, world, interleave) // block_size
        return int(phys[mine].max()) + 1 if bool(mine.any()) else 0
    virtual = block_size * world
    first = rank * interleave  # first offset of a virtual block owned by `rank`
    if first >= virtual:
        return 0
    last_vb, rem = divmod(seq_len - 1, virtual)
    return last_vb + (1 if rem >= first else 0)


@functools.lru_cache(maxsize=4096)
def max_table_index(max_model_len: int, block_size: int, kernel_block_size: int,
                    world: int, interleave: int) -> int:
    """Highest logical table index any position ``< max_model_len`` needs.

    The largest index lies in the last virtual block, so only that one is scanned.
    """
    lo = max(0, max_model_len - block_size * max(world, 1))
    pos = np.arange(lo, max_model_len, dtype=np.int64)
    k, _, _ = table_index(pos, block_size, kernel_block_size, world, interleave)
    return int(k.max())


def table_guard_id(num_blocks: int, block_size: int, entry_size: int) -> int:
    """Block id held by the guard entries around a block table (past each row and above/below the table).

    It lies past every id of the cache (``num_blocks`` physical blocks of ``block_size``
    slots, seen through table entries of ``entry_size`` slots), so a kernel that reads
    outside its row writes a slot in ``[id * entry_size, (id + 1) * entry_size)`` that no
    real entry produces. Capped to fit the int32 tables.
    """
    return min(num_blocks * (block_size // max(entry_size, 1)) + TABLE_GUARD_GAP, 2**31 - 1)


def table_width(max_model_len: int, block_size: int, world: int) -> int:
    """Physical table width: one entry per virtual block of ``B * g`` positions
    (``world`` is the group's CP size ``g``; v2 tables are ``BPK`` times wider in kernel blocks)."""
    return cdiv(max_model_len, block_size * world)


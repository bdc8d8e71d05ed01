"""Reference slot mapping: SPEC §2 in plain torch, straight from the allocation.

This is what every kernel must reproduce. It reads the allocator's per-request
block lists, not a path's table, so a path that builds its table wrongly cannot
make the reference wrong with it.
"""

from __future__ import annotations

import torch

from cpsim import layout
from cpsim.allocator import Allocation
from cpsim.layout import PAD_SLOT_ID
from cpsim.scenario import KVGroup, Scenario


def group_index(s: Scenario, g: KVGroup, positions: torch.Tensor):
    """(table index, offset, owner) of every position: the rank-independent part."""
    return layout.table_index(positions, g.block_size, g.b, g.world(s.cp), s.cp.interleave)


def group_slots(s: Scenario, g: KVGroup, alloc: Allocation, rank: int,
                positions: torch.Tensor, req: torch.Tensor, index=None) -> torch.Tensor:
    """Expected slot (or PAD) of every scheduled token for one group on one rank.

    ``index`` is ``group_index(s, g, positions)`` when the caller already has it
    (it is the same for every rank).
    """
    if not g.slot_mapped or positions.numel() == 0:
        return torch.full_like(positions, PAD_SLOT_ID)
    blocks = alloc.padded()
    pad = _padding(s, positions)
    if g.pads_replay:
        pad = pad | _replayed(s, positions)  # the cached KV stays as it is: replayed positions write nothing
    if g.circular:
        first = blocks[req, 0]
        return torch.where((positions >= 0) & ~pad, first * g.block_size + positions % g.b, PAD_SLOT_ID)
    n = g.world(s.cp)
    k, o, owner = group_index(s, g, positions) if index is None else index
    phys_idx = k // g.bpk
    # Block 0 is the null block: an index past the request's allocation (``num_blocks``) reads 0 -> PAD.
    phys = blocks[req, phys_idx.clamp(max=blocks.shape[1] - 1)]
    mine = (owner == layout.shard_rank(rank, n)) & (phys_idx < blocks.shape[1]) & (phys != 0) & ~pad
    return torch.where(mine, phys * g.block_size + (k % g.bpk) * g.b + o, PAD_SLOT_ID)


def _padding(s: Scenario, positions: torch.Tensor) -> torch.Tensor:
    """is_padding of the scheduled tokens (the first ``len(positions)`` of them)."""
    mask = torch.from_numpy(s.batch.padding_mask())
    n = positions.numel()
    if mask.numel() >= n:
        return mask[:n]
    return torch.cat([mask, torch.zeros(n - mask.numel(), dtype=torch.bool)])


def _replayed(s: Scenario, positions: torch.Tensor) -> torch.Tensor:
    """Replayed tokens among the first ``len(positions)`` scheduled ones."""
    mask = torch.from_numpy(s.replay_mask())
    n = positions.numel()
    if mask.numel() >= n:
        return mask[:n]
    return torch.cat([mask, torch.zeros(n - mask.numel(), dtype=torch.bool)])


def rank_slots(s: Scenario, allocs: list[Allocation], rank: int, num_entries: int) -> torch.Tensor:
    """[groups, num_entries] int64: the whole buffer as a correct kernel leaves it."""
    positions = torch.from_numpy(s.batch.positions())
    req = torch.from_numpy(s.batch.token_request())
    out = torch.full((len(s.groups), num_entries), PAD_SLOT_ID, dtype=torch.int64)
    n = min(num_entries, positions.numel())
    for gi, g in enumerate(s.groups):
        out[gi, :n] = group_slots(s, g, allocs[gi], rank, positions, req)[:n]
    return out

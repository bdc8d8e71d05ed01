"""Reference slot mapping: SPEC §2 in plain numpy, straight from the allocation.

This is what every kernel must reproduce. It reads the allocator's per-request
block lists, not a path's table, so a path that builds its table wrongly cannot
make the reference wrong with it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from cpsim import layout
from cpsim.allocator import Allocation
from cpsim.layout import PAD_SLOT_ID
from cpsim.scenario import KVGroup, Scenario


def group_index(s: Scenario, g: KVGroup, positions):
    """(table index, offset, owner) of every position: the rank-independent part."""
    return layout.table_index(positions, g.block_size, g.b, g.world(s.cp), s.cp.interleave)


def stacked_blocks(allocs: Sequence[Allocation]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """([ranks, num_reqs, width] block ids, 0 past each request's blocks; [ranks] each rank's own width;
    [ranks, num_reqs] blocks each request holds).

    Each rank's ``padded()`` table, stacked: a rank's own width bounds its table indices, so an index
    past it reads no block even where a wider rank pads the stack. Which entries are blocks is the
    live count (vLLM's ``num_blocks``), never the id: block 0 is a block (vLLM 0.33.0 allocates it)."""
    own: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # replicas share one allocation object
    for a in allocs:
        if id(a) not in own:
            own[id(a)] = (a.padded().numpy(), a.live())
    mats = [own[id(a)][0] for a in allocs]
    widths = np.array([m.shape[1] for m in mats], dtype=np.int64)
    reqs = max((m.shape[0] for m in mats), default=0)
    out = np.zeros((len(mats), reqs, int(widths.max(initial=1))), dtype=np.int64)
    live = np.zeros((len(mats), reqs), dtype=np.int64)
    for r, m in enumerate(mats):
        out[r, :m.shape[0], :m.shape[1]] = m
        n = own[id(allocs[r])][1]
        live[r, :n.size] = np.minimum(n, m.shape[1])
    return out, widths, live


def world_slots(s: Scenario, g: KVGroup, allocs: Sequence[Allocation], ranks: Sequence[int],
                positions: np.ndarray, req: np.ndarray, pad: np.ndarray, replayed: np.ndarray,
                stacked: tuple | None = None) -> np.ndarray:
    """[len(ranks), tokens] int64: expected slot (or PAD) of every scheduled token, group ``g``, on each rank.

    ``allocs[i]`` is rank ``ranks[i]``'s allocation of the group; ``pad`` / ``replayed`` are the
    batch's is_padding and replay masks over the same tokens; ``stacked``: ``stacked_blocks(allocs)``
    when the caller has it.
    """
    out = np.full((len(ranks), positions.size), PAD_SLOT_ID, dtype=np.int64)
    if not g.slot_mapped or positions.size == 0 or not len(ranks):
        return out
    blocks, widths, live = stacked if stacked is not None else stacked_blocks(allocs)
    if g.pads_replay:
        pad = pad | replayed  # the cached KV stays as it is: replayed positions write nothing
    if g.circular:
        first = blocks[:, req, 0]
        return np.where((positions >= 0) & ~pad, first * g.block_size + positions % g.b, PAD_SLOT_ID)
    n = g.world(s.cp)
    k, o, owner = group_index(s, g, positions)
    phys_idx = k // g.bpk
    shard = np.asarray([layout.shard_rank(r, n) for r in ranks], dtype=np.int64)
    # (rank, token) pairs the rank owns: about one rank per token when sharded, so the work stays ~tokens.
    rr, tt = np.nonzero((owner[None, :] == shard[:, None]) & ~pad[None, :])
    reqs, width = blocks.shape[1], blocks.shape[2]
    idx = phys_idx[tt]
    # An index past the request's live blocks (``num_blocks``) has no block -> PAD; an id 0 below it is block 0.
    phys = blocks.reshape(-1)[(rr * reqs + req[tt]) * width + np.minimum(idx, width - 1)]
    keep = (idx < widths[rr]) & (idx < live[rr, req[tt]])
    rr, tt, phys = rr[keep], tt[keep], phys[keep]
    out[rr, tt] = phys * g.block_size + (k[tt] % g.bpk) * g.b + o[tt]
    return out


def _mask(mask: np.ndarray, n: int) -> np.ndarray:
    """``mask`` cut or extended (False) to ``n`` tokens."""
    if mask.size >= n:
        return mask[:n]
    return np.concatenate([mask, np.zeros(n - mask.size, dtype=bool)])


def group_slots(s: Scenario, g: KVGroup, alloc: Allocation, rank: int,
                positions: torch.Tensor, req: torch.Tensor) -> torch.Tensor:
    """Expected slot (or PAD) of every scheduled token for one group on one rank."""
    pos = positions.numpy()
    out = world_slots(s, g, [alloc], [rank], pos, req.numpy(), _mask(s.batch.padding_mask(), pos.size),
                      _mask(s.replay_mask(), pos.size))
    return torch.from_numpy(out[0])


def expected(s: Scenario, allocs_world: Sequence[Sequence[Allocation]]) -> dict[int, torch.Tensor]:
    """{group index: [ranks, tokens] int64}: every slot-mapped group's expected slots on every rank, from
    ``allocs_world[rank][group]``."""
    pos, req = s.batch.positions(), s.batch.token_request()
    pad, replayed = _mask(s.batch.padding_mask(), pos.size), _mask(s.replay_mask(), pos.size)
    ranks = range(len(allocs_world))
    return {gi: torch.from_numpy(world_slots(s, g, [allocs_world[r][gi] for r in ranks], ranks, pos, req, pad,
                                             replayed))
            for gi, g in enumerate(s.groups) if g.slot_mapped}


def rank_slots(s: Scenario, allocs: list[Allocation], rank: int, num_entries: int) -> torch.Tensor:
    """[groups, num_entries] int64: the whole buffer as a correct kernel leaves it."""
    positions = torch.from_numpy(s.batch.positions())
    req = torch.from_numpy(s.batch.token_request())
    out = torch.full((len(s.groups), num_entries), PAD_SLOT_ID, dtype=torch.int64)
    n = min(num_entries, positions.numel())
    for gi, g in enumerate(s.groups):
        out[gi, :n] = group_slots(s, g, allocs[gi], rank, positions, req)[:n]
    return out

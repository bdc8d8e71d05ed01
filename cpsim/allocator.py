"""Simulated KV-cache allocator: which physical blocks each request holds on each rank.

Block ids are drawn at random without replacement from ``[1, num_blocks)`` (block 0
is the null block), so a kernel that reads the wrong table entry lands on a wrong
but plausible block instead of an obviously sequential one. Huge caches are
sampled sparsely: only the ids actually handed out are materialised.

The allocation is the ground truth shared by the paths (which turn it into their
own table layouts) and by the coordinator (which knows where every token must go).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from cpsim import layout
from cpsim.scenario import INT32_MAX, KVGroup, Scenario

SHARED_RANK = 0xFFFF  # seed tag for groups every rank holds identically


@dataclass(frozen=True)
class Allocation:
    """Physical block ids per request (batch order) for one rank and one group."""

    blocks: tuple[np.ndarray, ...]

    def padded(self, width: int | None = None) -> torch.Tensor:
        """[num_reqs, width] int64, 0 beyond each request's blocks."""
        w = max([len(b) for b in self.blocks] + [1]) if width is None else width
        out = np.zeros((len(self.blocks), w), dtype=np.int64)
        for i, b in enumerate(self.blocks):
            n = min(len(b), w)
            out[i, :n] = b[:n]
        return torch.from_numpy(out)

    def live(self) -> np.ndarray:
        """[num_reqs] blocks each request really holds (vLLM's ``num_blocks``): an id 0 among them is a block."""
        return np.array([len(b) for b in self.blocks], dtype=np.int64)


def _blocks_for(s: Scenario, g: KVGroup, rank: int, seq_len: int) -> int:
    if seq_len <= 0:
        return 0
    if g.circular or not g.slot_mapped:
        return 1
    n = layout.blocks_touched(seq_len, rank, g.block_size, g.world(s.cp), s.cp.interleave)
    return min(n, g.row_blocks) if g.row_blocks else n  # a tail group holds its row's blocks only


def allocate(s: Scenario, rank: int, group_index: int) -> Allocation:
    """Replicas (ranks with the same shard rank ``rank % g``) get identical block ids."""
    return _draw(s, group_index, layout.shard_rank(rank, s.groups[group_index].world(s.cp)))


def _draw(s: Scenario, group_index: int, shard: int) -> Allocation:
    """Group ``group_index``'s blocks on shard rank ``shard``, drawn from a generator seeded by the scenario,
    the group and the shard (one tag for a group every rank holds whole)."""
    g = s.groups[group_index]
    n = g.world(s.cp)
    rng = np.random.default_rng([s.seed, group_index, SHARED_RANK if n == 1 else shard])
    counts = [_blocks_for(s, g, shard, length) for length in s.batch.allocated_lens()]
    total = sum(counts)
    ids = rng.choice(g.num_blocks - 1, size=total, replace=False).astype(np.int64) + 1
    ends = list(itertools.accumulate(counts))
    return Allocation(tuple(ids[e - n:e] for n, e in zip(counts, ends)))


def allocate_rank(s: Scenario, rank: int) -> list[Allocation]:
    return [allocate(s, rank, gi) for gi in range(len(s.groups))]


def allocate_world(s: Scenario) -> list[list[Allocation]]:
    """[rank][group] allocations for every rank of the CP group.

    Ranks with the same shard rank of a group share one allocation object: they hold the
    same ids by construction, so it is drawn once per (group, shard rank)."""
    memo: dict[tuple[int, int], Allocation] = {}
    out = []
    for r in range(s.cp.world):
        row = []
        for gi, g in enumerate(s.groups):
            key = (gi, layout.shard_rank(r, g.world(s.cp)))
            if key not in memo:
                memo[key] = _draw(s, *key)
            row.append(memo[key])
        out.append(row)
    return out


# ---- table layouts -----------------------------------------------------

@dataclass(frozen=True)
class TableEntries:
    """The non-null entries of an int32 block table, to be written into a table of ``shape``.

    Built without materialising the table: tables are as wide as ``max_model_len`` allows
    (often millions of entries) while a batch holds a few blocks, so the paths fill the
    table once, on the device, and write only these (``cpsim.paths._guard.table``).
    """

    shape: tuple[int, int]   # [num_rows, entries per row]
    rows: list[int]          # rows a request uses (all-null apart from ``ids``)
    index: np.ndarray        # int64 flat (row-major) positions of ``ids``
    ids: np.ndarray          # int32 block ids


def table_entries(alloc: Allocation, rows: list[int], num_rows: int, width: int, bpk: int = 1) -> TableEntries:
    """Request i's blocks in row ``rows[i]`` (-1 rows skipped) of a [num_rows, width * bpk] table.

    ``width`` counts physical blocks; with ``bpk`` > 1 physical id q becomes kernel blocks
    q*BPK .. q*BPK+BPK-1 (the hybrid expansion). Blocks past ``width`` are dropped: an
    undersized table is exactly the bug the ``block-sizing`` invariant reports, so it must
    not crash here. Ids past int32 cannot exist in upstream's int32 tables: OverflowError.
    """
    cols = max(width, 1) * bpk
    used = sorted({r for r in rows if 0 <= r < num_rows})
    index, ids = [], []
    for i, row in enumerate(rows):
        if row >= 0 and i < len(alloc.blocks):
            b = alloc.blocks[i][:width]
            if bpk > 1:
                b = (b[:, None] * bpk + np.arange(bpk)).reshape(-1)
            index.append(row * cols + np.arange(len(b)))
            ids.append(b)
    flat = np.concatenate(index) if index else np.zeros(0, np.int64)
    values = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    if values.size and int(values.max()) > INT32_MAX:
        raise OverflowError("block id does not fit the int32 block table")
    return TableEntries((num_rows, cols), used, flat.astype(np.int64), values.astype(np.int32))


def physical_table(alloc: Allocation, rows: list[int], num_rows: int, width: int) -> torch.Tensor:
    """int32 [num_rows, width]: request i's blocks in row ``rows[i]``, 0 elsewhere (no guards)."""
    e = table_entries(alloc, rows, num_rows, width)
    out = torch.zeros(e.shape, dtype=torch.int32)
    out.view(-1)[torch.from_numpy(e.index)] = torch.from_numpy(e.ids)
    return out

"""Inputs are the kernel's to read, not to write: what a user's kernel changed in its inputs.

A runtime keeps its block tables, positions and request maps from one step to the next; a kernel
that stores into them (a callable zeroing ``block_table``, a Triton kernel writing the rows it
read) corrupts every later step, while its own slots may still be right. So every launch of a
user's kernel is bracketed: before it, a copy of each input it is handed (for a block table, the
whole allocation the table is a view of, not only the rows the batch uses); after it, the entries
that differ are counted per (group, input) and the copy is put back, so later launches and ranks
see the inputs cpsim built. The counts travel with the rank's slots as plain integers
(``RankOutput.written``) and the coordinator judges them (invariant ``inputs-intact``).

The comparison runs where the kernel ran (the kernel worker, on the kernel's device): one copy
and one compare per input and launch. Cost: docs/BENCHMARKS.md.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

# The columns of ``RankOutput.written`` (and of the coordinator's gathered counts).
INPUTS = ("positions", "query_start_loc", "idx_mapping", "block table")
NOT_WATCHED = -1  # a rank run whose kernels were cpsim's own: nothing was bracketed


def counts(num_groups: int) -> torch.Tensor:
    """Zeroed [num_groups, len(INPUTS)] counts for one rank run (``bracket`` adds to them)."""
    return torch.zeros((num_groups, len(INPUTS)), dtype=torch.int64)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """The allocation a view belongs to (writes past the view's rows count too)."""
    base = t._base if t._base is not None else t
    return base if base.is_contiguous() or base.dim() == 0 else t


@contextmanager
def bracket(written: torch.Tensor | None, inputs: list[tuple[int, str, torch.Tensor]]):
    """Around one launch: ``inputs`` are (group index, input name, tensor handed to the kernel); the
    entries it wrote are added to ``written`` (``counts``). None: nothing is bracketed (cpsim's kernels)."""
    if written is None:
        yield
        return
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    plan = []
    for gi, name, t in inputs:
        whole = _whole(t)
        key = id(whole)
        if key not in seen:  # one copy per allocation, however many groups share it
            seen[key] = (whole, whole.clone())
            plan.append((gi, INPUTS.index(name), key))
    try:
        yield
    finally:
        for gi, col, key in plan:
            whole, copy = seen[key]
            differ = whole != copy
            if whole.is_floating_point():
                differ &= ~(whole.isnan() & copy.isnan())
            n = int(differ.sum())
            if n:
                written[gi, col] += n
                whole.copy_(copy)  # later launches and ranks read what cpsim built


def describe(gi_name: str, col: int, count: int, rank: int) -> str:
    return f"kernel wrote {count} entr{'y' if count == 1 else 'ies'} of group {gi_name}'s {INPUTS[col]} on rank {rank}"

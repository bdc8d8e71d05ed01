"""The virtual world: every rank of a CP group run in turn in one process.

Outputs are stacked exactly as an all-gather would stack them, so the
coordinator cannot tell a virtual run from a torchrun one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from cpsim.allocator import allocate_rank
from cpsim.paths import Knobs, RankOutput, run_path
from cpsim.scenario import Scenario


@dataclass
class Gathered:
    """One path's outputs of every rank: what the all-gather hands the coordinator."""

    path: str
    slots: torch.Tensor          # [ranks, groups, entries] int64
    enabled: torch.Tensor        # [ranks, groups] bool
    widths: torch.Tensor         # [ranks, groups] int64
    entry_sizes: torch.Tensor    # [ranks, groups] int64


def stack(path: str, outs: list[RankOutput]) -> Gathered:
    return Gathered(
        path,
        torch.stack([o.slots.cpu().to(torch.int64) for o in outs]),
        torch.tensor([o.enabled for o in outs], dtype=torch.bool),
        torch.tensor([o.widths for o in outs], dtype=torch.int64),
        torch.tensor([o.entry_sizes for o in outs], dtype=torch.int64),
    )


def knobs_for(rank: int, knobs: Knobs, inject_rank: int | None) -> Knobs:
    """A fault injected on one rank only leaves the others correct."""
    return knobs if inject_rank is None or inject_rank == rank else Knobs(kernel_design=knobs.kernel_design)


def run_virtual(s: Scenario, paths: list[str], knobs: Knobs = Knobs(), inject_rank: int | None = None,
                device: str = "cpu", kernels: dict | None = None,
                on_rank: Callable[[str, int], None] | None = None) -> dict[str, Gathered]:
    """``kernels`` maps a path name to the user's kernel that replaces its built-in one;
    ``on_rank(path, rank)`` is called after each rank's run (progress bars)."""
    kernels = kernels or {}
    allocs = [allocate_rank(s, r) for r in range(s.cp.world)]
    gathered: dict[str, Gathered] = {}
    for path in paths:
        outs = []
        for r in range(s.cp.world):
            outs.append(run_path(path, s, allocs[r], r, device, knobs_for(r, knobs, inject_rank), kernels.get(path)))
            if on_rank is not None:
                on_rank(path, r)
        if outs[0] is not None:
            gathered[path] = stack(path, outs)
    return gathered

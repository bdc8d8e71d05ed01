"""The virtual world: every rank of a CP group run in turn in one process.

Outputs are stacked exactly as an all-gather would stack them, so the
coordinator cannot tell a virtual run from a torchrun one.
"""

from __future__ import annotations

from typing import Callable

import torch

from cpsim.allocator import allocate_world
from cpsim.check.gathered import Gathered
from cpsim.paths import KernelFailure, Knobs, RankOutput
from cpsim.run.runner import KernelRunner, given
from cpsim.scenario import Scenario


def stack(path: str, outs: list[RankOutput]) -> Gathered:
    return Gathered(
        path,
        torch.stack([o.slots.cpu().to(torch.int64) for o in outs]),
        torch.tensor([o.enabled for o in outs], dtype=torch.bool),
        torch.tensor([o.widths for o in outs], dtype=torch.int64),
        torch.tensor([o.entry_sizes for o in outs], dtype=torch.int64),
        torch.stack([o.guard for o in outs]) if outs and all(o.guard is not None for o in outs) else None,
        written=torch.stack([o.written for o in outs]) if outs and all(o.written is not None for o in outs) else None,
        output_faults=(torch.tensor([o.output_faults for o in outs], dtype=torch.int64)
                       if outs and all(o.output_faults is not None for o in outs) else None),
    )


def failed(path: str, s: Scenario, failure: KernelFailure) -> Gathered:
    """A path whose kernel did not complete on some rank: nothing to check but the failure."""
    ranks, groups = s.cp.world, len(s.groups)
    return Gathered(path, torch.zeros((ranks, groups, 0), dtype=torch.int64), torch.zeros((ranks, groups), dtype=torch.bool),
                    torch.zeros((ranks, groups), dtype=torch.int64), torch.ones((ranks, groups), dtype=torch.int64),
                    failures=[failure])


def knobs_for(rank: int, knobs: Knobs, inject_rank: int | None) -> Knobs:
    """A fault injected on one rank only leaves the others correct (the host sizing is every rank's)."""
    return knobs if inject_rank is None or inject_rank == rank else \
        Knobs(kernel_design=knobs.kernel_design, host_sizing=knobs.host_sizing)


def rank_knobs(s: Scenario, knobs: Knobs, inject_rank: int | None = None) -> list[Knobs]:
    """Each rank's knobs (``knobs_for``), in rank order."""
    return [knobs_for(r, knobs, inject_rank) for r in range(s.cp.world)]


def run_virtual(s: Scenario, paths: list[str], knobs: Knobs = Knobs(), inject_rank: int | None = None,
                device: str = "cpu", kernels: dict | None = None,
                on_rank: Callable[[str, int], None] | None = None,
                allocs: list | None = None, runner: KernelRunner | None = None) -> dict[str, Gathered]:
    """``kernels`` maps a path name to the user's kernel that replaces its built-in one;
    ``on_rank(path, rank)`` is called after each rank's run (progress bars); ``allocs`` is
    ``allocate_world(s)`` when the caller already has it.

    Rank runs go to ``runner`` (worker processes, bounded in time; ``cpsim.run.runner``; none: one of
    this call's own); a path whose kernel fails on a rank stops there and is gathered as failed.
    """
    if allocs is None:
        allocs = allocate_world(s)
    per_rank = rank_knobs(s, knobs, inject_rank)
    with given(runner) as r:
        results = r.run_paths(s, paths, allocs, device, per_rank, kernels or {}, on_rank)
    gathered: dict[str, Gathered] = {}
    for path in paths:
        r = results[path]
        if isinstance(r, KernelFailure):
            gathered[path] = failed(path, s, r)
        elif r and r[0] is not None:
            gathered[path] = stack(path, r)
    return gathered

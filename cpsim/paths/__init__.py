"""Paths: how one rank drives the kernels, the way the serving runtimes do.

A path runs a single rank. It gets the scenario, that rank's allocation and its
total CP rank, and returns the rank's slot-mapping buffers; it knows nothing of
other ranks, processes or collectives. What it hands its kernels comes from the
preparation the world hands in (``cpsim.paths.prep``).
"""

from __future__ import annotations

import torch

from cpsim.errors import ConfigError
from cpsim.paths import adapters, replay_padding, v1, v2
from cpsim.paths.prep import PerRank
from cpsim.paths.types import KERNEL_DESIGNS, PATHS, KernelFailure, Knobs, RankOutput, first_failure  # noqa: F401

RUNNERS = {"v1": v1.run, "v1-fused": v1.run_fused, "v1-torch": v1.run_torch, "v2": v2.run}


def run_path(name: str, scenario, allocs, rank: int, device: torch.device | str = "cpu",
             knobs: Knobs = Knobs(), kernel=None, inputs: PerRank | None = None) -> RankOutput | None:
    """Run one path for one rank; None when the path does not apply to the scenario.

    Inputs, launches, read-back: everything the rank run hands its kernels comes from ``inputs``, the
    preparation the world hands in (``cpsim.paths.prep``: ``PerRank``, made for this run alone - also
    when None is given - or a stage's ``Staged``, prepared with the other ranks the world runs in this
    process), and its buffers are read back through it after the launches. ``kernel`` (a
    ``cpsim.kernels.under_test.KernelUnderTest``) replaces the path's built-in kernel; tables and
    buffers are built the same way. Its ``replay`` kernel, if any, replaces the built-in
    replay-padding kernel that runs after them (``cpsim.paths.replay_padding``).
    """
    if name not in RUNNERS:
        raise ConfigError("paths", f"unknown path {name!r}; choose from {', '.join(PATHS)}")
    if inputs is None:
        inputs = PerRank(scenario, device)
    elif inputs.s is not scenario or inputs.device != torch.device(device):
        raise ValueError(f"rank {rank}'s inputs were prepared for another scenario or device than {device}")
    if kernel is not None and (not kernel.builtin or kernel.replay is not None):
        inputs.count_writes()  # a user's kernel: what it writes into its inputs is counted
    if kernel is not None and not kernel.builtin:
        out = adapters.run(kernel, name, scenario, allocs, rank, inputs, knobs)
    else:
        out = RUNNERS[name](scenario, allocs, rank, inputs, knobs)
    if out is not None:  # the runtime's replay pass, after the slot-mapping kernels (cpsim's or the user's)
        replay_padding.pad(scenario, out.slots, inputs, knobs, getattr(kernel, "replay", None))
        inputs.read_back(out)  # rows are views into guarded storage: one copy (or one per stage)
    return out

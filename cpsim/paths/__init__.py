"""Paths: how one rank drives the kernels, the way the serving runtimes do.

A path runs a single rank. It gets the scenario, that rank's allocation and its
total CP rank, and returns the rank's slot-mapping buffers; it knows nothing of
other ranks, processes or collectives.
"""

from __future__ import annotations

import torch

from cpsim.layout import POISON  # noqa: F401  (re-exported for the paths)
from cpsim.paths.types import KERNEL_DESIGNS, PATHS, KernelFailure, Knobs, RankOutput, first_failure  # noqa: F401


def staging(s, allocs: dict, device, builtin: bool = True, defer: bool = False):
    """A context in which the ranks ``allocs`` names (rank -> allocations) share their preparation
    (``cpsim.paths.prep.Staged``) - only where every kernel is cpsim's (``builtin``); a no-op (None) when
    any is the user's, the slot-mapping kernel or the replay kernel beside a built-in one. ``defer``:
    the ranks' outputs are read back together by the stage's ``settle``."""
    import contextlib

    from cpsim.paths import prep
    return prep.staged(s, allocs, device, defer) if builtin else contextlib.nullcontext()


def run_path(name: str, scenario, allocs, rank: int, device: torch.device | str = "cpu",
             knobs: Knobs = Knobs(), kernel=None) -> RankOutput | None:
    """Run one path for one rank; None when the path does not apply to the scenario.

    Inputs, launches, read-back: everything the rank run hands its kernels comes from one
    preparation (``cpsim.paths.prep``: made for this run alone, or staged with the other ranks the
    world runs in this process), and its buffers are read back through it after the launches.
    ``kernel`` (a ``cpsim.kernels.under_test.KernelUnderTest``) replaces the path's built-in kernel;
    tables and buffers are built the same way. Its ``replay`` kernel, if any, replaces the built-in
    replay-padding kernel that runs after them (``cpsim.paths.replay``).
    """
    from cpsim.paths import _guard, _intact, adapters, prep, replay, v1, v2

    runners = {"v1": v1.run, "v1-fused": v1.run_fused, "v1-torch": v1.run_torch, "v2": v2.run}
    if name not in runners:
        from cpsim.errors import ConfigError
        raise ConfigError("paths", f"unknown path {name!r}; choose from {', '.join(PATHS)}")
    import contextlib
    inputs = prep.for_rank(scenario, rank, device)
    users = kernel is not None and (not kernel.builtin or kernel.replay is not None)
    intact = _intact.watching(len(scenario.groups)) if users else contextlib.nullcontext()
    with _guard.Watch(len(scenario.groups)) as watch, intact as written:
        if kernel is not None and not kernel.builtin:
            out = adapters.run(kernel, name, scenario, allocs, rank, inputs.device, knobs)
        else:
            out = runners[name](scenario, allocs, rank, inputs, knobs)
        if out is not None:  # the runtime's replay pass, after the slot-mapping kernels (cpsim's or the user's)
            replay.pad(scenario, out.slots, inputs, knobs, getattr(kernel, "replay", None))
    if out is not None:
        inputs.read_back(watch, out)  # rows are views into guarded storage: one copy (or one per stage)
        out.written = written
    return out

"""Paths: how one rank drives the kernels, the way the serving runtimes do.

A path runs a single rank. It gets the scenario, that rank's allocation and its
total CP rank, and returns the rank's slot-mapping buffers; it knows nothing of
other ranks, processes or collectives.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from cpsim.layout import POISON  # noqa: F401  (re-exported for the paths)

PATHS = ("v1", "v1-fused", "v1-torch", "v2")
KERNEL_DESIGNS = ("per-request", "tile")


@dataclass(frozen=True)
class Knobs:
    """Deliberate deviations from the correct runtime (the bug catalogue uses them), and the host
    sizing under test (``--sizing``): widths and buffer lengths a sizing function gave each host."""

    kernel_fault: int = 0                 # FAULT_* bits compiled into the built-in kernels
    virtual_from_kernel_block: bool = False  # virtual block built from b instead of B
    unsharded_width_per_cp: bool = False  # mamba / unsharded tables divided by CP size
    sharded_width_undivided: bool = False  # attention tables not divided by CP size
    buffer_size: int = 0                  # slot buffer entries; 0 = the correct capacity
    draft_overwrite: bool = False         # draft slots written into the main buffer first
    kernel_design: str = "per-request"    # "per-request" (vllm-ascend-faithful) | "tile" (tile-parallel)
    host_sizing: tuple = ()               # ``--sizing``: table widths and buffer per host (cpsim.sizing.HostSizing)

    def buffer_entries(self, s, path: str) -> int:
        """Slot-buffer entries ``path`` allocates: the plugged-in sizing's, the fault's, else the correct capacity."""
        from cpsim.sizing import sized_buffer
        given = sized_buffer(self.host_sizing, path)
        return given if given is not None else (self.buffer_size or s.limits.slot_buffer_size)

    def __post_init__(self) -> None:
        from cpsim.sizing import HostSizing
        # A repro file reads back dicts; frozen, so the normalised tuple is set past the guard.
        object.__setattr__(self, "host_sizing", tuple(
            h if isinstance(h, HostSizing) else HostSizing(h["host"], tuple(h["table_widths"]),
                                                           h["slot_buffer_len"], h.get("source", ""))
            for h in self.host_sizing))
        if self.kernel_design not in KERNEL_DESIGNS:
            from cpsim.errors import ConfigError
            raise ConfigError("kernel_design", f"must be one of {', '.join(KERNEL_DESIGNS)}, "
                                               f"got {self.kernel_design!r}")


@dataclass
class RankOutput:
    """One rank's result for one path. ``slots`` is [groups, buffer entries] int64 (on the host once
    ``run_path`` has read the rank's buffers back)."""

    slots: torch.Tensor
    enabled: list[bool]       # the path produced a mapping for this group
    widths: list[int]         # entries per row of the table the kernel read
    entry_sizes: list[int]    # slots per table entry (b for logical tables, B for physical)
    guard: torch.Tensor | None = None  # [groups, 2 * _guard.WIDTH] guard entries around the rows after the launches
    written: torch.Tensor | None = None  # [groups, len(_intact.INPUTS)] input entries a user's kernel wrote
    output_faults: list[int] | None = None  # per group, a callable's result's fault (``adapters.OUTPUT_FAULTS``)


@dataclass
class KernelFailure:
    """A rank's run of a path that did not complete: the kernel raised, crashed, hung or ended its process."""

    path: str
    rank: int
    kind: str                 # "raised" | "crashed" | "timeout" | "exited"
    message: str              # one line naming the kernel's deed, the rank and (when known) the group
    group: str = "*"
    not_run: list[int] = field(default_factory=list)  # ranks of the path left unrun after it


def first_failure(failures: list[KernelFailure]) -> KernelFailure:
    """Several ranks may fail one path: the lowest is reported, the others named in its message."""
    failures = sorted(failures, key=lambda f: f.rank)
    first, rest = failures[0], failures[1:]
    if not rest:
        return first
    also = ", ".join(f"rank {f.rank} ({f.kind})" for f in rest)
    return dataclasses.replace(first, message=f"{first.message}; also failed on {also}")


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

"""The data types of one rank's run of a path, shared by the path modules and the layers above:
what a run is told (``Knobs``) and what comes back (``RankOutput``, ``KernelFailure``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from cpsim.errors import ConfigError
from cpsim.schema import KERNEL_DESIGNS, PATH_NAMES
from cpsim.sizing import sized_buffer, HostSizing

PATHS = PATH_NAMES


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
        given = sized_buffer(self.host_sizing, path)
        return given if given is not None else (self.buffer_size or s.limits.slot_buffer_size)

    def __post_init__(self) -> None:
        # A repro file reads back dicts; frozen, so the normalised tuple is set past the guard.
        object.__setattr__(self, "host_sizing", tuple(
            h if isinstance(h, HostSizing) else HostSizing(h["host"], tuple(h["table_widths"]),
                                                           h["slot_buffer_len"], h.get("source", ""))
            for h in self.host_sizing))
        if self.kernel_design not in KERNEL_DESIGNS:
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
    kind: str                 # "raised" | "crashed" | "timeout" | "exited" | "garbled"
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

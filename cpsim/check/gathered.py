"""What the all-gather hands the coordinator: one path's outputs of every rank, stacked."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Gathered:
    """One path's outputs of every rank: what the all-gather hands the coordinator."""

    path: str
    slots: torch.Tensor          # [ranks, groups, entries] int64
    enabled: torch.Tensor        # [ranks, groups] bool
    widths: torch.Tensor         # [ranks, groups] int64
    entry_sizes: torch.Tensor    # [ranks, groups] int64
    guards: torch.Tensor | None = None  # [ranks, groups, 2 * guard width] entries around each output row
    written: torch.Tensor | None = None  # [ranks, groups, inputs] input entries the user's kernel wrote
    output_faults: torch.Tensor | None = None  # [ranks, groups] a callable's result's fault code (0: none)
    failures: list = field(default_factory=list)  # paths.KernelFailure: rank runs that did not complete (no outputs)

"""What ``cpsim run`` judges, built once from its options: the scenario, paths, kernels, profile, knobs and
reports of one run, for the virtual world and torchrun alike. Imported with the command (it brings torch);
``cmd.inputs`` holds the option readers, torch-free, that ``cli`` checks input with first."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from cpsim import faults, sizing
from cpsim import scenario as sc
from cpsim.check import profiles
from cpsim.cmd.contracts import Judged
from cpsim.cmd.inputs import (check_paths_apply, kernel_runner, kernels_from_args, knobs_with_sizing, parse_paths,
                              profile_from_args, replica_builder, torchrun_world)
from cpsim.errors import ConfigError
from cpsim.paths.types import Knobs
from cpsim.presets import PRESETS
from cpsim.report.outputs import ReportFiles
from cpsim.run.dist import select_device
from cpsim.run.torchrun_env import launched_by_torchrun


@dataclasses.dataclass
class RunInputs:
    """What ``cpsim run`` judges, built once from its options before any kernel runs (bad input: exit 2
    here): the scenario as the profile lays it out, the paths, the kernels under test and their release
    contracts, the knobs (a fault, the sizing under test) and the reports asked for. Under torchrun
    ``replica(i)`` builds CP group i's scenario (seed + i)."""
    scenario: sc.Scenario
    paths: list[str]
    device: str
    kernels: dict
    profile: Any
    judged: Judged
    knobs: Knobs
    inject: str | None
    inject_rank: int | None
    sizing: str | None
    strict_sizing: bool
    report: ReportFiles
    runner: Any
    options: Any              # the parsed options, for what the torchrun executor reads (timeout, device)
    label: str = ""
    replica: Any = None

    @classmethod
    def from_args(cls, args) -> "RunInputs":
        """Raises ConfigError (exit 2) on bad input and ``SizingFailure`` (exit 1) when the sizing under test
        fails."""
        torchrun = launched_by_torchrun()
        report, runner = ReportFiles.from_args(args), kernel_runner(args)
        replica, s = replica_builder(args, int(os.environ["WORLD_SIZE"]) if torchrun else None)
        if torchrun:
            torchrun_world(s.cp.world, f"the scenario (DCP {s.cp.dcp} x PCP {s.cp.pcp})", "--dcp/--pcp")
        paths = parse_paths(args.paths)
        check_paths_apply([s], paths, args)
        device = select_device(args.device).device
        kernels = kernels_from_args(args, device, paths)
        prof = profile_from_args(args, kernels)
        s = profiles.scenario_for(s, prof)  # vLLM: KV sharded over DCP only; layouts the release lacks: exit 2
        inject_rank, knobs = getattr(args, "inject_on_rank", None), Knobs(kernel_design=args.kernel_design)
        if getattr(args, "inject", None):  # --inject NAME [--inject-on-rank R]: the fault's knobs on s
            fault = faults.get(args.inject, "--inject")
            if inject_rank is not None and not 0 <= inject_rank < s.cp.world:
                raise ConfigError("--inject-on-rank", f"must lie in [0, {s.cp.world}) (CP world size {s.cp.world})")
            knobs = dataclasses.replace(fault.knobs_for(s), kernel_design=args.kernel_design)
        elif inject_rank is not None:
            raise ConfigError("--inject-on-rank", "needs --inject NAME")
        knobs = knobs_with_sizing(args, knobs, s, paths)
        label = args.scenario if args.scenario in PRESETS else Path(args.scenario).stem
        return cls(s, paths, device, kernels, prof, Judged.of(kernels, paths, prof, s), knobs, getattr(args, "inject", None),
                   inject_rank, getattr(args, "sizing", None), bool(getattr(args, "strict_sizing", False)),
                   report, runner, args, label,
                   (lambda i: profiles.scenario_for(replica(i), prof)) if torchrun else None)

    def describe(self, console) -> None:
        """What the report's table does not say: the kernels' adapter notes, the profile, the release
        contracts, what the built-in kernels leave out of the scenario, the host sizing under test."""
        self.judged.describe(console)
        self.judged.describe_contracts(console)
        for hs in self.knobs.host_sizing:
            console.print(f"host sizing ({hs.host}) from {hs.source}: table widths {list(hs.table_widths)} KV blocks, "
                          f"slot buffer {hs.slot_buffer_len}", highlight=False, soft_wrap=True, markup=False)
        dtype, builtin = self.scenario.limits.slot_buffer_dtype, [p for p in self.paths if p not in self.kernels]
        if dtype != "abi" and builtin:
            console.print(f"  note: limits.slot_buffer_dtype {dtype} reaches a kernel under test; cpsim's built-in "
                          f"kernels on {', '.join(builtin)} keep their int64 buffer", highlight=False, soft_wrap=True,
                          markup=False)
        unsized = sorted({sizing.host_of(p) for p in self.paths} - {hs.host for hs in self.knobs.host_sizing})
        if self.sizing and unsized:
            console.print(f"  note: --sizing {self.sizing} sizes no {'/'.join(unsized)} host; cpsim's own sizing "
                          f"stood there", highlight=False, soft_wrap=True, markup=False)


"""`cpsim run`: one scenario, every selected path, every CP rank, one verdict.

Without a launcher the CP ranks run in turn in one process (the virtual world).
Under `torchrun` (detected by RANK / WORLD_SIZE in the environment) each
process is one rank: W = R x N ranks form R CP groups of N; N defaults to the
whole world (DCP = W // PCP) unless `--dcp` says otherwise.
"""

from __future__ import annotations

import dataclasses

import torch

from cpsim import faults
from cpsim.allocator import allocate_world
from cpsim.check import coordinator
from cpsim.cmd.inputs import sizing_failed
from cpsim.cmd.run_inputs import RunInputs
from cpsim.cmd.torchrun_job import execute_torchrun
from cpsim.errors import ConfigError
from cpsim.faults.detect import reaches
from cpsim.kernels.under_test import to_record
from cpsim.paths import Knobs
from cpsim.report import report, terminal
from cpsim.report.progress import progress
from cpsim.run.distrun import Entry
from cpsim.run.host_sizer import SizingFailure
from cpsim.run.world import run_virtual

# Below this many (token x rank x path) kernel entries a run is too quick for a bar.
PROGRESS_MIN_WORK = 200_000


def main(args) -> int:
    try:
        run = RunInputs.from_args(args)
    except SizingFailure as e:
        return sizing_failed(terminal.console(), e)
    if run.replica is not None:
        return execute_torchrun(run.options, Entry(run.label, run.replica, run.scenario.cp.world, run.paths,
                                                   knobs=run.knobs, inject_rank=run.inject_rank,
                                                   kernels=run.kernels, profile=run.profile),
                                run.judged, run.report, run.runner)
    return run_here(run)


def run_here(run: RunInputs) -> int:
    """The CP ranks in turn in this process; the verdicts, the terminal report and the files asked for."""
    s, paths = run.scenario, run.paths
    console = terminal.console()
    work = s.cp.world * len(paths)
    quiet = run.report.quiet or s.batch.num_tokens * work < PROGRESS_MIN_WORK
    with progress(f"{s.name}: {paths[0]} rank 0 (the first launch compiles)", total=work, quiet=quiet,
                  console=console) as bar:
        gathered = run_virtual(s, paths, device=run.device, knobs=run.knobs, inject_rank=run.inject_rank,
                               kernels=run.kernels, on_rank=lambda path, r: bar.advance(label=f"{path} rank {r}"),
                               runner=run.runner)
    skipped = [p for p in paths if p not in gathered]
    verdicts = coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world, run.profile)
    if run.inject and coordinator.passed(verdicts):
        _fault_must_show(run, gathered)
    for p in skipped:
        verdicts += coordinator.not_run(p, f"not applicable at CP world size {s.cp.world} (CP size 1 only)")
    subjects = run.judged.subjects()
    waste = coordinator.sizing_waste(s, gathered, run.profile) if run.strict_sizing else []
    if not run.report.quiet:
        report.print_report(console, s, verdicts, examples=run.report.examples, subjects=subjects, gathered=gathered)
        run.describe(console)
        for line in waste:
            console.print(f"  [yellow]note (strict sizing):[/yellow] {line}", highlight=False, soft_wrap=True)
    else:
        console.print("pass" if coordinator.passed(verdicts) else "FAIL")
        run.judged.describe_contracts(console, quiet=True)
    extra = {"paths_skipped": skipped, "profile": run.profile.name,
             "profile_notes": run.judged.profile_notes,
             "contracts": run.judged.contracts(),
             "sizing_waste": waste,
             "host_sizing": [dataclasses.asdict(hs) for hs in run.knobs.host_sizing],
             "inject": run.inject, "inject_rank": run.inject_rank,
             "kernels": {p: {"spec": k.spec, "abi": k.abi, "notes": k.notes} for p, k in run.kernels.items()}}
    run.report.write(s, verdicts, extra, subjects, gathered, page_extra={"paths_skipped": skipped})
    return run.judged.status(verdicts)


def _fault_must_show(run: RunInputs, gathered: dict) -> None:
    """``--inject`` where the fault cannot show is bad input (exit 2), not a silent pass.

    It cannot show when it cannot reach any selected path's kernel (a FAULT_* switch and a user's
    kernel), or when the injected run wrote exactly what the fault-free run writes: the scenario
    never exercises what the fault breaks. A fault that changes the mapping but breaks no invariant
    is a miss of the checker, and stays exit 0 with the report."""
    s = run.scenario
    fault = faults.get(run.inject, "--inject")
    hint = (f"its own trigger shows it: cpsim bugs reproduce {fault.name} "
            f"(or cpsim bugs show {fault.name} --dump FILE.json, then cpsim run --scenario FILE.json)")
    record = to_record(run.kernels, run.kernels)
    affected = [p for p in run.paths if p in fault.paths and p in gathered]
    reach = [p for p in affected if not reaches(fault, p, record)]
    if not affected:
        raise ConfigError("--inject", f"{fault.name} affects {', '.join(fault.paths)}, none of which ran here; {hint}")
    if not reach:
        raise ConfigError("--inject", f"{fault.name} cannot reach the kernels under test: "
                                      f"{reaches(fault, affected[0], record)}; {hint}")
    clean = run_virtual(s, run.paths, device=run.device,
                        knobs=Knobs(kernel_design=run.knobs.kernel_design, host_sizing=run.knobs.host_sizing),
                        kernels=run.kernels, runner=run.runner)
    if gathered.keys() == clean.keys() and all(torch.equal(gathered[p].slots, clean[p].slots) and
                                               torch.equal(gathered[p].enabled, clean[p].enabled) for p in gathered):
        raise ConfigError("--inject", f"{fault.name} cannot show on scenario {s.name}: the injected run wrote the "
                                      f"same slot mappings as the fault-free run on every path and rank"
                                      f"{'' if run.inject_rank is None else f' (injected on rank {run.inject_rank})'}; "
                                      f"{hint}")

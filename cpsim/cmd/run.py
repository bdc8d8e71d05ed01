"""`cpsim run`: one scenario, every selected path, every CP rank, one verdict.

Without a launcher the CP ranks run in turn in one process (the virtual world).
Under `torchrun` (detected by RANK / WORLD_SIZE in the environment) each
process is one rank: W = R x N ranks form R CP groups of N; N defaults to the
whole world (DCP = W // PCP) unless `--dcp` says otherwise.
"""

from __future__ import annotations

import dataclasses
import copy
import os
from pathlib import Path

from cpsim.presets import PRESETS
from cpsim.report import terminal

from cpsim.check import coordinator

from cpsim.report import report
from cpsim import scenario as sc
from cpsim.allocator import allocate_world
from cpsim.cmd.inputs import (check_paths_apply, describe_kernels, kernel_runner, kernels_from_args, knobs_with_sizing,
                              parse_paths, profile_from_args, scenario_from_args, show_profile, subjects_for)
from cpsim.cmd.contracts import kernel_standings, print_contracts, run_status
from cpsim.cmd.torchrun_job import execute_torchrun, torchrun_world
from cpsim.check import profiles
from cpsim.run.dist import launched_by_torchrun
from cpsim.run.host_sizer import SizingFailure
from cpsim import sizing
from cpsim.errors import ConfigError
from cpsim.paths import Knobs
from cpsim.report.progress import progress
from cpsim.report.outputs import write_requested
from cpsim.kernels.under_test import to_record

# Below this many (token x rank x path) kernel entries a run is too quick for a bar.
PROGRESS_MIN_WORK = 200_000


def main(args) -> int:
    if getattr(args, "stack", None):
        from cpsim.cmd.stack_run import main_stack, main_stack_torchrun
        return main_stack_torchrun(args) if launched_by_torchrun() else main_stack(args)
    if launched_by_torchrun():
        return main_torchrun(args)
    from cpsim.run.dist import select_device
    from cpsim.run.world import run_virtual

    s = scenario_from_args(args)
    paths = parse_paths(args.paths)
    check_paths_apply([s], paths, args)
    dev = select_device(args.device)
    kernels = kernels_from_args(args, dev.device, paths)
    prof = profile_from_args(args, kernels)
    s = profiles.scenario_for(s, prof)  # vLLM: KV sharded over DCP only; layouts the release lacks: exit 2
    held = kernel_standings(kernels)
    console = terminal.console()
    knobs, inject_rank = _injection(args, s)
    try:
        knobs = knobs_with_sizing(args, knobs, s, paths)
    except SizingFailure as e:
        console.print(f"FAIL (--sizing): {e}", highlight=False, soft_wrap=True, markup=False)
        return 1
    work = s.cp.world * len(paths)
    quiet = args.quiet or s.batch.num_tokens * work < PROGRESS_MIN_WORK
    with progress(f"{s.name}: {paths[0]} rank 0 (the first launch compiles)", total=work, quiet=quiet,
                  console=console) as bar:
        gathered = run_virtual(s, paths, device=dev.device, knobs=knobs,
                               inject_rank=inject_rank,
                               kernels=kernels,
                               on_rank=lambda path, r: bar.advance(label=f"{path} rank {r}"),
                               runner=kernel_runner(args))
    skipped = [p for p in paths if p not in gathered]
    verdicts = coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world, prof)
    if args.inject and coordinator.passed(verdicts):
        _fault_must_show(args, s, paths, dev.device, kernels, gathered, inject_rank, knobs.host_sizing)
    for p in skipped:
        verdicts += coordinator.not_run(p, f"not applicable at CP world size {s.cp.world} (CP size 1 only)")
    subjects = subjects_for(kernels, paths, prof.name)
    waste = coordinator.sizing_waste(s, gathered, prof) if args.strict_sizing else []
    if not args.quiet:
        report.print_report(console, s, verdicts, examples=args.examples, subjects=subjects, gathered=gathered)
        describe_kernels(console, kernels, notes_only=True)
        show_profile(console, prof, s, paths)
        print_contracts(console, held)
        for hs in knobs.host_sizing:
            console.print(f"host sizing ({hs.host}) from {hs.source}: table widths {list(hs.table_widths)} KV blocks, "
                          f"slot buffer {hs.slot_buffer_len}", highlight=False, soft_wrap=True, markup=False)
        unsized = sorted({sizing.host_of(p) for p in paths} - {hs.host for hs in knobs.host_sizing})
        if args.sizing and unsized:
            console.print(f"  note: --sizing {args.sizing} sizes no {'/'.join(unsized)} host; cpsim's own sizing "
                          f"stood there", highlight=False, soft_wrap=True, markup=False)
        for line in waste:
            console.print(f"  [yellow]note (strict sizing):[/yellow] {line}", highlight=False, soft_wrap=True)
    else:
        console.print("pass" if coordinator.passed(verdicts) else "FAIL")
        print_contracts(console, held, quiet=True)
    extra = {"paths_skipped": skipped, "profile": prof.name, "profile_notes": profiles.notes(s, prof, paths),
             "contracts": {p: st.to_dict() for p, st in held.items()},
             "sizing_waste": waste,
             "host_sizing": [dataclasses.asdict(hs) for hs in knobs.host_sizing],
             "inject": args.inject, "inject_rank": inject_rank,
             "kernels": {p: {"spec": k.spec, "abi": k.abi, "notes": k.notes} for p, k in kernels.items()}}

    write_requested(args, s, verdicts, extra, subjects, gathered, page_extra={"paths_skipped": skipped})
    return run_status(verdicts, held)


def replica_builder(args, world: int | None):
    """``build(replica)``: the scenario of CP group ``replica`` (seed + replica), CP sized for ``world``."""
    base = scenario_from_args(args)
    if world is not None and args.dcp is None:
        pcp = base.cp.pcp
        if world % pcp:
            raise ConfigError("--pcp", f"world size {world} is not a multiple of PCP {pcp}")
        args = copy.copy(args)
        args.dcp = world // pcp
    is_file = args.scenario not in PRESETS

    def build(replica: int) -> sc.Scenario:
        a = copy.copy(args)
        if not is_file:
            a.seed = args.seed + replica
        s = scenario_from_args(a)
        return s.replace(seed=s.seed + replica) if is_file else s

    return build, build(0)


def main_torchrun(args) -> int:
    from cpsim.run.dist import select_device
    from cpsim.run.distrun import Entry

    world = int(os.environ["WORLD_SIZE"])
    build, s0 = replica_builder(args, world)
    n = s0.cp.world
    torchrun_world(n, f"the scenario (DCP {s0.cp.dcp} x PCP {s0.cp.pcp})", "--dcp/--pcp")
    label = args.scenario if args.scenario in PRESETS else Path(args.scenario).stem
    paths = parse_paths(args.paths)
    check_paths_apply([s0], paths, args)
    knobs, inject_rank = _injection(args, s0)
    try:
        knobs = knobs_with_sizing(args, knobs, s0, paths)
    except SizingFailure as e:
        print(f"FAIL (--sizing): {e}", flush=True)
        return 1
    kernels = kernels_from_args(args, select_device(args.device).device, paths)
    prof = profile_from_args(args, kernels)
    profiles.scenario_for(s0, prof)  # a layout the release lacks: exit 2 before any rank runs
    entry = Entry(label, lambda replica: profiles.scenario_for(build(replica), prof), n, paths, knobs=knobs,
                  inject_rank=inject_rank, kernels=kernels, profile=prof)
    return execute_torchrun(args, entry)


def _same(a: dict, b: dict) -> bool:
    """The two runs wrote the same slot mappings on every path and rank."""
    import torch
    return a.keys() == b.keys() and all(torch.equal(a[p].slots, b[p].slots) and torch.equal(a[p].enabled, b[p].enabled)
                                        for p in a)


def _fault_must_show(args, s, paths: list[str], device: str, kernels: dict, gathered: dict,
                     inject_rank: int | None, host_sizing: tuple = ()) -> None:
    """``--inject`` where the fault cannot show is bad input (exit 2), not a silent pass.

    It cannot show when it cannot reach any selected path's kernel (a FAULT_* switch and a user's
    kernel), or when the injected run wrote exactly what the fault-free run writes: the scenario
    never exercises what the fault breaks. A fault that changes the mapping but breaks no invariant
    is a miss of the checker, and stays exit 0 with the report."""
    from cpsim import faults
    from cpsim.faults.detect import reaches
    from cpsim.run.world import run_virtual

    fault = faults.get(args.inject, "--inject")
    hint = (f"its own trigger shows it: cpsim bugs reproduce {fault.name} "
            f"(or cpsim bugs show {fault.name} --dump FILE.json, then cpsim run --scenario FILE.json)")
    record = to_record(kernels, kernels)
    affected = [p for p in paths if p in fault.paths and p in gathered]
    reach = [p for p in affected if not reaches(fault, p, record)]
    if not affected:
        raise ConfigError("--inject", f"{fault.name} affects {', '.join(fault.paths)}, none of which ran here; {hint}")
    if not reach:
        raise ConfigError("--inject", f"{fault.name} cannot reach the kernels under test: "
                                      f"{reaches(fault, affected[0], record)}; {hint}")
    clean = run_virtual(s, paths, device=device, knobs=Knobs(kernel_design=args.kernel_design, host_sizing=host_sizing),
                        kernels=kernels, runner=kernel_runner(args))
    if _same(gathered, clean):
        raise ConfigError("--inject", f"{fault.name} cannot show on scenario {s.name}: the injected run wrote the "
                                      f"same slot mappings as the fault-free run on every path and rank"
                                      f"{'' if inject_rank is None else f' (injected on rank {inject_rank})'}; {hint}")


def _injection(args, s) -> tuple[Knobs, int | None]:
    rank = getattr(args, "inject_on_rank", None)
    if not getattr(args, "inject", None):
        if rank is not None:
            raise ConfigError("--inject-on-rank", "needs --inject NAME")
        return Knobs(kernel_design=args.kernel_design), None
    from cpsim import faults
    fault = faults.get(args.inject, "--inject")
    if rank is not None and not 0 <= rank < s.cp.world:
        raise ConfigError("--inject-on-rank", f"must lie in [0, {s.cp.world}) (CP world size {s.cp.world})")
    return dataclasses.replace(fault.knobs_for(s), kernel_design=args.kernel_design), rank

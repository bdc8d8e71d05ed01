"""`cpsim replay FILE`: rerun a fuzz repro, a capture or an explicit batch; say whether it still fails.

FILE is a repro written by `cpsim fuzz`, a capture directory (rank*.cpcap, written
under CPSIM_CAPTURE) or an explicit batch (.npz/.json). For a capture or a batch the
first step, rank, group and token that break an invariant are reported; `--shrink OUT`
writes the smallest explicit batch that still fails. For a repro, the kernels it
recorded (built-in, or the user's kernel fuzz ran with) are loaded again;
`--kernel-v1/--kernel-v2 SPEC` replaces one (`builtin` = cpsim's own), and the host
sizing it recorded (`--sizing`) is asked again (`--sizing SPEC` replaces it; `cpsim` = cpsim's own). Without a
launcher the CP ranks run in turn in one process; under torchrun
(`launch/local.sh 8 replay FILE`) each process is one rank and every CP group of the
world reruns the repro's scenario. Exit 1 while the violation shows.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console

from cpsim.report import terminal

from cpsim import faults
from cpsim import fuzz as fz
from cpsim import scenario as sc
from cpsim import schema
from cpsim.report import report
from cpsim.check import profiles
from cpsim.cmd.inputs import (kernel_runner, kernels_with_record, knobs_with_sizing, profile_from_args,
                              sizer_from_args, sizing_failed)
from cpsim.cmd.inputs import torchrun_world
from cpsim.cmd.contracts import Judged, describe_kernels, show_profile, subjects_for
from cpsim.cmd.torchrun_job import execute_torchrun
from cpsim.run.dist import launched_by_torchrun, select_device
from cpsim.errors import ConfigError
from cpsim.kernels.under_test import to_record
from cpsim.paths import Knobs
from cpsim.parsing import parse
from cpsim.validate import check_world, read_data
from cpsim.report.outputs import ReportFiles, write_requested
from cpsim.run.host_sizer import SizingFailure


def _verdict(console: Console, recorded: list[str], failed: bool, now: list[str]) -> int:
    if not failed:
        console.print(f"[green]violation no longer shows[/green] (recorded: {', '.join(recorded) or 'none'})")
        return 0
    same = "same as recorded" if now == recorded else f"recorded: {', '.join(recorded) or 'none'}"
    console.print(f"[bold red]violation reproduced[/bold red]: {', '.join(now)} ({same})", highlight=False)
    return 1


def main(args) -> int:
    from cpsim.capture import replay_steps as capture_replay
    from cpsim.capture.steps import is_replayable
    if is_replayable(args.file):
        if getattr(args, "kernel_replay", None):
            raise ConfigError("--kernel-replay", "captures and explicit batches hold no replay starts: the "
                                                 "replay-padding kernel would never run")
        return capture_replay.main(args, runner=kernel_runner(args))
    if args.shrink:
        raise ConfigError("--shrink", "applies to captures and explicit batches; a fuzz repro is already shrunk")
    r = load_repro(args.file, accept_edited=args.accept_edited)
    if launched_by_torchrun():
        return main_torchrun(args, r)
    check_world(r.scenario, args.allow_large)
    dev = select_device(args.device)
    kernels = kernels_with_record(args, r.kernels, dev.device, r.paths)
    prof = profile_from_args(args, kernels, r.profile)
    sizer = sizer_from_args(args, r.sizing)
    r = dataclasses.replace(r, profile=prof.name, sizing=sizer.spec if sizer else "")
    console = terminal.console()
    if sizer is not None:
        try:
            sizer.check()  # a module or function that is not there: exit 2 before the run
        except SizingFailure as e:
            return sizing_failed(console, e)
    out = fz.replay(r, dev.device, kernels, sizer, kernel_runner(args))
    if sizer is not None:
        sizer.close()
    recorded = r.violation.get("invariants", [])
    subjects = subjects_for(kernels, r.paths, prof.name)
    if not args.quiet:
        if r.inject:
            console.print(f"injected fault: {r.inject}")
        if r.sizing:
            console.print(f"host sizing under test: {r.sizing}", highlight=False, markup=False, soft_wrap=True)
        if out.error:
            console.print(f"[red]error:[/red] {out.error}", highlight=False)
        else:
            report.print_report(console, r.scenario, out.verdicts, examples=args.examples, subjects=subjects,
                                gathered=out.gathered)
        describe_kernels(console, kernels, notes_only=not out.error)
        show_profile(console, prof, r.scenario, r.paths)
        if out.not_expressible:
            console.print(f"[yellow]not judged:[/yellow] {out.not_expressible}", highlight=False, soft_wrap=True)
    extra = {"inject": r.inject, "violation": out.summary(), "recorded_violation": r.violation,
             "kernels": to_record(kernels, r.paths), "profile": prof.name, "sizing": r.sizing or None}

    code = _verdict(console, recorded, out.failed, out.invariants())
    write_requested(args, r.scenario, out.verdicts, extra, subjects, out.gathered)
    return code


def main_torchrun(args, r: fz.Repro) -> int:
    """Every CP group of the world reruns the repro's scenario (CP size from the scenario)."""
    from cpsim.run.distrun import Entry

    s = r.scenario
    torchrun_world(s.cp.world, f"the repro's scenario (DCP {s.cp.dcp} x PCP {s.cp.pcp})", "FILE")
    kernels = kernels_with_record(args, r.kernels, select_device(args.device).device, r.paths)
    prof = profile_from_args(args, kernels, r.profile)
    s = profiles.scenario_for(s, prof)
    try:
        knobs = knobs_with_sizing(args, r.knobs, s, r.paths, sizer_from_args(args, r.sizing))
    except SizingFailure as e:
        return sizing_failed(terminal.console(), e)
    entry = Entry(f"replay {s.fingerprint()}", lambda replica: s, s.cp.world, r.paths, knobs=knobs,
                  kernels=kernels, profile=prof)
    recorded = r.violation.get("invariants", [])

    def summary(console: Console, results) -> None:
        now = sorted({v.invariant for g in results for v in g.verdicts if v.status == "fail"})
        _verdict(console, recorded, bool(now), now)

    return execute_torchrun(args, entry, Judged.of(kernels, r.paths, prof, s), ReportFiles.from_args(args),
                            kernel_runner(args), summary, {"inject": r.inject, "recorded_violation": r.violation,
                                                           "kernels": to_record(kernels, r.paths)})


def load_repro(path: str | Path, accept_edited: bool = False):
    """A repro file for ``replay``; refused when its scenario no longer has the recorded fingerprint."""
    data = read_data(path, "FILE", "repro")
    if "schema" not in data:
        raise ConfigError("FILE", f"{path} is not a cpsim repro file (no \"schema\": {schema.REPRO_SCHEMA!r})")
    m = parse(schema.ReproModel, data, "repro", str(path))
    s = sc.validate(sc.Scenario.from_dict(m.scenario.model_dump()))
    if not accept_edited:
        if m.fingerprint is None:
            raise ConfigError("repro.fingerprint", f"is required: replay checks the scenario against it "
                                                   f"(--accept-edited replays without the check) (in {path})")
        if s.fingerprint() != m.fingerprint:
            raise ConfigError("repro.scenario", f"was edited: its fingerprint is {s.fingerprint()}, the repro "
                                                f"recorded {m.fingerprint}; pass --accept-edited to replay the "
                                                f"edited scenario (in {path})")
    if m.inject is not None and m.inject not in faults.names():
        raise ConfigError("repro.inject", f"unknown fault {m.inject!r}; known faults: {', '.join(faults.names())} "
                                          f"(in {path})")
    kernels = {p: (v.model_dump() if isinstance(v, BaseModel) else v) for p, v in m.kernels.items()}
    if m.profile:
        try:
            profiles.get(m.profile)
        except ConfigError:
            raise ConfigError("repro.profile", f"unknown profile {m.profile!r}; known: {', '.join(profiles.PROFILES)} "
                                               f"(in {path})") from None
    return fz.Repro(s, list(m.paths or fz.DEFAULT_PATHS), Knobs(**m.knobs.model_dump()), m.inject,
                    m.violation.model_dump(), kernels, profile=m.profile or "", sizing=m.sizing or "")

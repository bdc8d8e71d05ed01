"""`cpsim bugs`: the bug catalogue — list, show, reproduce by name, detection matrix."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from rich.console import Console

from cpsim.report import terminal
from rich.table import Table

from cpsim import faults, kernels
from cpsim.report import report
from cpsim.cmd.inputs import (check_paths_apply, kernel_runner, kernels_from_args, parse_paths, knobs_with_sizing,
                              profile_from_args, sizing_failed)
from cpsim.cmd.inputs import torchrun_world
from cpsim.cmd.contracts import Judged, describe_kernels, show_profile, subjects_for
from cpsim.cmd.torchrun_job import execute_torchrun
from cpsim.check import profiles
from cpsim.run.dist import launched_by_torchrun, select_device
from cpsim.errors import ConfigError
from cpsim.paths import Knobs
from cpsim.presets import PRESETS
from cpsim.scenario import Scenario
from cpsim.report.outputs import ReportFiles, write_requested
from cpsim.run.host_sizer import SizingFailure
from cpsim.kernels.under_test import to_record
from cpsim.report.progress import progress


def _sharding(s, g) -> str:
    n = g.world(s.cp)
    if n == 1:
        return "not sharded"
    return "CP-sharded" if n == s.cp.world else f"CP size {n} ({s.cp.world // n} replicas)"


# ---- list / show ------------------------------------------------------------------

def trigger_size(s: Scenario) -> str:
    return (f"CP {s.cp.world}, {s.batch.num_reqs} req, {s.batch.num_tokens} tok, "
            f"max {max(g.num_blocks for g in s.groups)} blocks")


def list_markdown() -> str:
    lines = ["| fault | paths | injection | trigger | expected invariants | references |",
             "| --- | --- | --- | --- | --- | --- |"]
    for f in faults.registry().values():
        lines.append(f"| `{f.name}` | {', '.join(f.paths)} | {knob_text(f.knobs)} | {trigger_size(f.trigger())} | "
                     f"{', '.join(f.invariants)} | {'; '.join(f.references)} |")
    return "\n".join(lines)


def main_list(args) -> int:
    if args.markdown:
        terminal.console().print(list_markdown(), highlight=False, markup=False, soft_wrap=True)
        return 0
    t = Table(title="cpsim bug catalogue (docs/SPEC.md §6)")
    t.add_column("name", style="bold", no_wrap=True)
    t.add_column("paths")
    t.add_column("caught by")
    t.add_column("reference")
    for f in faults.registry().values():
        t.add_row(f.name, ", ".join(f.paths), ", ".join(f.invariants), "; ".join(f.references))
    terminal.console().print(t)
    return 0


def knob_text(k: Knobs) -> str:
    bits = {v: n[len("FAULT_"):].lower() for n, v in vars(kernels).items()
            if n.startswith("FAULT_") and isinstance(v, int) and v}
    parts = []
    for fld in dataclasses.fields(k):
        v = getattr(k, fld.name)
        if v == fld.default:
            continue
        if fld.name == "kernel_fault":
            v = "|".join(f"FAULT_{name.upper()}" for bit, name in sorted(bits.items()) if v & bit)
        parts.append(f"{fld.name}={v}")
    return ", ".join(parts) or "none"


def scenario_lines(s: Scenario) -> list[str]:
    lim = s.limits
    lines = [f"CP: DCP {s.cp.dcp} x PCP {s.cp.pcp} = {s.cp.world} rank(s), interleave {s.cp.interleave}"]
    for g in s.groups:
        kb = f", kernel block {g.b} (BPK {g.bpk})" if g.bpk > 1 else ""
        cache = "" if g.prefix_cacheable else ", not prefix-cacheable" + (
            f" (replay window {g.prefix_replay_tokens})" if g.prefix_replay_tokens else "")
        lines.append(f"group {g.name}: {g.kind}, B {g.block_size}{kb}, "
                     f"{_sharding(s, g)}, {g.num_blocks} blocks per rank{cache}")
    lines.append(f"limits: max_model_len {lim.max_model_len}, max_num_reqs {lim.max_num_reqs}, "
                 f"max_num_batched_tokens {lim.max_num_batched_tokens}, "
                 f"num_speculative_tokens {lim.num_speculative_tokens} -> slot buffer {lim.slot_buffer_size}")
    reqs = s.batch.requests
    shown = ", ".join(f"[{r.context_len}, {r.seq_len})" for r in reqs[:6]) + (" ..." if len(reqs) > 6 else "")
    pad = f", padded to {s.batch.num_tokens_padded}" if s.batch.num_tokens_padded else ""
    lines.append(f"batch: {len(reqs)} request(s), {s.batch.num_tokens} token(s){pad}; positions {shown}")
    replays = [f"request {i} from {r.replay_start}" for i, r in enumerate(reqs) if r.replay_start]
    if replays:
        lines.append(f"replay: {', '.join(replays)} (window {s.replay_window}; PAD in the prefix-cacheable groups)")
    return lines


def main_show(args) -> int:
    f = faults.get(args.name, "name")
    c = terminal.console()
    s = f.trigger()
    c.print(f"[bold]{f.name}[/bold] — {f.summary}")
    c.print(f.explanation, highlight=False)
    c.print(f"[bold]references:[/bold] {'; '.join(f.references)}")
    c.print(f"[bold]affects paths:[/bold] {', '.join(f.paths)}")
    c.print(f"[bold]injection (Knobs):[/bold] {knob_text(f.knobs)}", highlight=False)
    c.print(f"[bold]triggering scenario[/bold] ({s.name}, fingerprint {s.fingerprint()}):")
    for line in scenario_lines(s):
        c.print(f"  {line}", highlight=False)
    c.print(f"[bold]expected violation:[/bold] {', '.join(f.invariants)}")
    if f.limits:
        c.print(f"[bold]modelling limit:[/bold] {f.limits}", highlight=False)
    c.print(f"reproduce: cpsim bugs reproduce {f.name}   (fixed form: --fixed)")
    if args.dump:
        if Path(args.dump).suffix not in (".json", ".toml"):
            raise ConfigError("--dump", f"{args.dump!r} must end in .json or .toml")
        s.dump(args.dump)
        c.print(f"scenario written to {args.dump} (cpsim run --scenario {args.dump} --inject {f.name})")
    return 0


# ---- reproduce --------------------------------------------------------------------

ownership_table = report.ownership_table  # the table lives with the report that prints it


def _verdict(c: Console, f, fixed: bool, failed: dict[str, list[str]]) -> int:
    """The closing line of a reproduction; exit 1 when an invariant broke."""
    if failed:
        expected = [i for i in f.invariants if i in failed]
        caught_by = "; ".join(f"{k} ({', '.join(v)})" for k, v in failed.items())
        c.print(f"[bold red]{'fixed form still fails' if fixed else 'bug reproduced'}[/bold red]: "
                f"{caught_by}; "
                f"expected {', '.join(f.invariants)} -> {'hit ' + ', '.join(expected) if expected else 'MISSED'}",
                highlight=False)
        return 1
    c.print("[bold green]fixed: every invariant holds[/bold green]" if fixed
            else "[bold yellow]the fault did not show on this run[/bold yellow]")
    return 0


def main_reproduce(args) -> int:
    from cpsim.faults import detect

    f = faults.get(args.name, "name")
    paths = parse_paths(args.paths)
    s = f.trigger()
    if args.inject_on_rank is not None and not 0 <= args.inject_on_rank < s.cp.world:
        raise ConfigError("--inject-on-rank", f"must lie in [0, {s.cp.world}) for {f.name}'s scenario "
                                              f"(CP world size {s.cp.world})")
    check_paths_apply([s], paths, args)
    dev = select_device(args.device)
    kernels = kernels_from_args(args, dev.device, paths)
    prof = profile_from_args(args, kernels)
    s = profiles.scenario_for(s, prof)
    c = terminal.console()
    mode = "fixed form" if args.fixed else f"fault injected ({knob_text(f.knobs)})"
    where = "" if args.inject_on_rank is None else f" on rank {args.inject_on_rank}"
    if os.environ.get("RANK", "0") == "0":  # under torchrun rank 0 alone prints
        c.print(f"[bold]{f.name}[/bold]: {mode}{where}; references {'; '.join(f.references)}", highlight=False)
    if launched_by_torchrun():
        return _reproduce_torchrun(args, f, s, paths, kernels, prof)
    try:  # the host sizing under test, over the fault's knobs (its widths and buffer stand in for the fault's)
        raw = f.trigger()  # detect.run lays it out by the profile, as detect.reproduce does; sized as laid out
        knobs = knobs_with_sizing(args, detect.knobs(f, raw, args.fixed), s, paths)
    except SizingFailure as e:
        return sizing_failed(c, e)
    r = detect.run(raw, knobs, paths, args.inject_on_rank, dev.device, kernels, prof, kernel_runner(args))
    subjects = subjects_for(kernels, paths, prof.name)
    report.print_report(c, s, r.verdicts, title=f"{s.name} [{s.fingerprint()}]", examples=args.examples,
                        subjects=subjects, gathered=r.gathered)
    describe_kernels(c, kernels, notes_only=True)
    show_profile(c, prof, s, paths)
    skipped = [p for p in paths if p not in r.gathered]
    for p in skipped:
        c.print(f"[dim]{p}: not applicable at CP world size {s.cp.world}[/dim]")
    own = detect.ownership(r)
    if knobs.host_sizing:
        c.print(f"host sizing under test: {args.sizing}", highlight=False, markup=False, soft_wrap=True)
    extra = {"fault": f.name, "fixed": args.fixed, "inject_rank": args.inject_on_rank,
             "knobs": dataclasses.asdict(knobs), "paths_skipped": skipped,
             "profile": prof.name, "profile_notes": profiles.notes(s, prof, paths)}

    code = _verdict(c, f, args.fixed, r.failed)
    write_requested(args, s, r.verdicts, {**extra, "ownership": [dataclasses.asdict(o) for o in own]}, subjects,
                    r.gathered, page_extra=extra)
    return code


def _reproduce_torchrun(args, f, s: Scenario, paths: list[str], kernels: dict, prof=None) -> int:
    """Every CP group of the world runs the fault's trigger (CP size from the trigger)."""
    from cpsim.check import coordinator
    from cpsim.run.distrun import Entry
    from cpsim.faults import detect

    torchrun_world(s.cp.world, f"{f.name}'s trigger scenario (DCP {s.cp.dcp} x PCP {s.cp.pcp})", "name")
    try:
        knobs = knobs_with_sizing(args, detect.knobs(f, s, args.fixed), s, paths)
    except SizingFailure as e:
        return sizing_failed(terminal.console(), e)
    entry = Entry(f.name, lambda replica: s, s.cp.world, paths, knobs=knobs, inject_rank=args.inject_on_rank,
                  kernels=kernels, profile=prof)

    def summary(c: Console, results) -> None:
        failed: dict[str, list[str]] = {}
        for g in results:
            for v in g.verdicts:
                if v.status == "fail" and v.path not in failed.setdefault(v.invariant, []):
                    failed[v.invariant].append(v.path)
        _verdict(c, f, args.fixed, {k: failed[k] for k in coordinator.INVARIANTS if failed.get(k)})

    judged = Judged.of(kernels, paths, prof or profiles.for_abis([k.abi for k in kernels.values()]),
                       s if prof is not None else None)
    return execute_torchrun(args, entry, judged, ReportFiles.from_args(args), kernel_runner(args), summary,
                            {"fault": f.name, "fixed": args.fixed, "inject_rank": args.inject_on_rank,
                             "knobs": dataclasses.asdict(knobs)})


# ---- matrix -----------------------------------------------------------------------

def _cell(c) -> str:
    if not c.applicable:
        return "n/a"
    if c.baseline_failed:
        return "baseline fails"
    return ", ".join(c.failed) if c.failed else "-"


def matrix_markdown(m, scenarios: list[str]) -> str:
    lines = ["| fault | paths | " + " | ".join(scenarios) + " |",
             "| --- | --- | " + " | ".join("---" for _ in scenarios) + " |"]
    for name in m.faults:
        cells = {c.scenario: c for c in m.for_fault(name)}
        f = faults.get(name)
        lines.append(f"| `{name}` | {', '.join(f.paths)} | "
                     + " | ".join(_cell(cells[sc]) for sc in scenarios) + " |")
    caught, total = m.rate
    notes = "".join(f"\n- `{name}` n/a: {why}" for name, why in not_applicable(m).items())
    return "\n".join(lines) + f"\n\ncaught {caught}/{total}" + (f"\n{notes}" if notes else "")


def not_applicable(m) -> dict[str, str]:
    """Why each n/a cell cannot show its fault, one line per fault (its distinct reasons joined)."""
    out: dict[str, list[str]] = {}
    for cl in m.cells:
        if not cl.applicable and cl.why:
            reasons = out.setdefault(cl.fault, [])
            text = f"{cl.scenario}: {cl.why}"
            if cl.why not in " ".join(reasons):
                reasons.append(text)
    return {k: "; ".join(v) for k, v in out.items()}


def main_matrix(args) -> int:
    from cpsim.faults import detect

    presets = () if args.presets.strip() == "none" else tuple(x.strip() for x in args.presets.split(",") if x.strip())
    bad = [p for p in presets if p not in PRESETS]
    if bad:
        raise ConfigError("--presets", f"unknown preset(s) {bad}; choose from {', '.join(PRESETS)} or 'none'")
    names = [x.strip() for x in args.faults.split(",")] if args.faults else faults.names()
    for n in names:
        faults.get(n, "--faults")
    if args.jobs < 0:
        raise ConfigError("--jobs", f"must be >= 0, got {args.jobs}")
    jobs = args.jobs or detect.default_jobs()
    kernels = kernels_from_args(args)
    c = terminal.console()
    describe_kernels(c, kernels)
    if kernels:
        c.print("[dim]fault switches compile into the built-in kernels only; on a path with a kernel under test "
                "'baseline fails' means that kernel fails the fault-free scenario[/dim]")
    scenarios = [detect.TRIGGER, *presets]
    record = to_record(kernels, kernels) if kernels else None
    with progress("detection matrix", total=detect.num_tasks(names, presets, record, args.seed),
                  console=terminal.console(stderr=True)) as bar:
        m = detect.matrix(names, presets, args.seed, jobs, on_done=lambda label: bar.advance(label=label),
                          kernel_record=record, runner=kernel_runner(args))
    caught, total = m.rate
    if args.markdown:
        c.print(matrix_markdown(m, scenarios), highlight=False, markup=False, soft_wrap=True)
    else:
        t = Table(title="detection matrix: invariants that caught each fault ('-' = not caught, n/a = the fault cannot "
                        "show there, reasons below)")
        t.add_column("fault", style="bold")
        for sc in scenarios:
            t.add_column(sc)
        t.add_column("caught", justify="center")
        for name in m.faults:
            cells = {cl.scenario: cl for cl in m.for_fault(name)}
            verdict = ("[green]yes[/green]" if m.caught(name) else "[bold red]NO[/bold red]") \
                if m.applicable(name) else "[dim]n/a[/dim]"
            t.add_row(name, *[(f"[red]{_cell(cells[sc])}[/red]" if cells[sc].caught else _cell(cells[sc]))
                              for sc in scenarios], verdict)
        c.print(t)
        for name, why in not_applicable(m).items():
            c.print(f"[dim]n/a[/dim] {name}: {why}", highlight=False, soft_wrap=True)
        skipped = len(m.faults) - total
        c.print(f"caught {caught}/{total}" + (f" ({skipped} row(s) n/a: the fault cannot show with the kernel under "
                                              f"test)" if skipped else ""),
                style="bold green" if caught == total else "bold red")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "presets": list(presets), "seed": args.seed, "caught": caught, "total": total,
            "not_applicable": not_applicable(m),
            "cells": [dataclasses.asdict(cl) | {"caught": cl.caught} for cl in m.cells]}, indent=2) + "\n")
    return 0 if caught == total else 1

"""`cpsim sweep`: a matrix of scenarios (presets x CP sizes x interleaves) through the paths.

In one process the CP ranks of each scenario run in turn (the virtual world).
Under torchrun each scenario with CP size N runs on W // N CP groups of N
consecutive ranks (replica g uses seed + g); ranks past the last full group
idle for it, and scenarios with N > W are skipped. The matrix comes from flags
or a TOML file (`--config`); flags win. TOML keys:

    presets = ["default", "mtp"]     # preset names or .json/.toml scenario files; "all" = every preset
    cp = [2, 4, "2x2"]               # CP sizes: N (DCP N) or "DxP"; omitted = each preset's own
    interleaves = [1, 16]            # omitted = each preset's own
    paths = ["v1", "v2"]
    seed = 0
"""

from __future__ import annotations

import difflib
import os
import sys
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from cpsim.presets import PRESETS
from cpsim.report import terminal
from rich.table import Table

from cpsim.check import coordinator, profiles

from cpsim.report import report
from cpsim import scenario as sc
from cpsim import schema
from cpsim.cmd.commands import KEYS
from cpsim.cmd.contracts import describe_kernels, kernel_standings, print_contracts, show_profile, status, subjects_for
from cpsim.cmd.inputs import (check_paths_apply, profile_from_args, kernels_from_args, parse_paths,
                              scenario_from_args, sizer_from_args, sizing_failed)
from cpsim.run.dist import launched_by_torchrun
from cpsim.errors import ConfigError
from cpsim.paths import PATHS, Knobs
from cpsim.validate import load_scenario, load_sweep_config, write_outputs
from cpsim.run.host_sizer import SizingFailure
from cpsim.cmd.inputs import kernel_runner
from cpsim.cmd.torchrun_job import rank0_writer
from cpsim.report.outputs import ReportFiles
from cpsim.report.progress import columns


@dataclass(frozen=True)
class Cell:
    scenario: str                 # preset name or file
    dcp: int | None
    pcp: int | None
    interleave: int | None

    @property
    def label(self) -> str:
        name = self.scenario if self.scenario in PRESETS else Path(self.scenario).stem
        cp = "" if self.dcp is None else f" cp{self.dcp}" if self.pcp in (None, 1) else f" cp{self.dcp}x{self.pcp}"
        return name + cp + ("" if self.interleave is None else f" i{self.interleave}")


def _items(value, field: str) -> list:
    if value is None:
        return []
    items = value if isinstance(value, list) else [x.strip() for x in str(value).split(",")]
    if "" in items and any(items):
        raise ConfigError(field, f"{value!r} has an empty entry (two commas, or one at an end)")
    items = [x for x in items if x]
    if not items:
        raise ConfigError(field, "must list at least one value")
    return items


def _int(x, field: str, hi: int) -> int:
    try:
        v = int(str(x).strip())
    except (TypeError, ValueError):
        raise ConfigError(field, f"{x!r} is not an integer") from None
    if not 1 <= v <= hi:
        raise ConfigError(field, f"{v} must lie in [1, {hi}]")
    return v


def _cp(x) -> tuple[int, int]:
    text = str(x).lower()
    if "x" in text:
        d, _, p = text.partition("x")
        return _int(d, "cp", schema.MAX_CP), _int(p, "cp", schema.MAX_CP)
    return _int(text, "cp", schema.MAX_CP), 1


def _scenario_spec(name: str) -> str:
    """A preset name, or a scenario file that loads: a sweep never skips a misspelt entry as a row."""
    if name in PRESETS:
        return name
    if Path(name).suffix in (".json", ".toml"):
        load_scenario(name)
        return name
    close = difflib.get_close_matches(name, PRESETS, n=1)
    raise ConfigError("presets", f"unknown preset {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                      + f"; presets: {', '.join(PRESETS)}, 'all', or .json/.toml files")


def load_matrix(args) -> dict:
    """The matrix: TOML values overridden by flags."""
    conf: dict = load_sweep_config(args.config) if args.config else {}
    for k in KEYS:
        v = getattr(args, k)
        if v is not None:
            conf[k] = v
    presets = _items(conf.get("presets", "default"), "presets")
    if presets == ["all"]:
        presets = list(PRESETS)
    paths = conf.get("paths")
    return {
        "presets": [_scenario_spec(str(p)) for p in presets],
        "cp": [_cp(x) for x in _items(conf.get("cp"), "cp")] or [None],
        "interleaves": [_int(x, "interleaves", schema.MAX_BLOCK)
                        for x in _items(conf.get("interleaves"), "interleaves")] or [None],
        "paths": parse_paths(",".join(paths) if isinstance(paths, list) else (paths or ",".join(PATHS))),
        "paths_given": paths is not None,
        "seed": int(conf.get("seed", 0)),
        "allow_large": bool(getattr(args, "allow_large", False)),
    }


def cells(matrix: dict) -> list[Cell]:
    return [Cell(p, cp[0] if cp else None, cp[1] if cp else None, i)
            for p in matrix["presets"] for cp in matrix["cp"] for i in matrix["interleaves"]]


def _builder(cell: Cell, seed: int, allow_large: bool = False):
    ns = Namespace(scenario=cell.scenario, dcp=cell.dcp, pcp=cell.pcp, interleave=cell.interleave,
                   seed=seed, allow_invalid=False, allow_large=allow_large)
    is_file = cell.scenario not in PRESETS

    def build(replica: int) -> sc.Scenario:
        s = scenario_from_args(Namespace(**{**vars(ns), "seed": seed + (0 if is_file else replica)}))
        return s.replace(seed=s.seed + replica) if is_file else s

    return build


def plan(matrix: dict, world: int | None, kernels: dict | None = None, profile=None, sizer=None):
    """(entries, skipped): the runnable cells and, for the others, why not. Deterministic on every rank.
    ``profile``: the release profile judging; each cell is laid out as its release does, and a cell it
    cannot express is skipped with the reason. ``sizer``: the host sizing under test
    (``cpsim.run.host_sizer.Sizer``), asked for each cell's laid-out scenario; its ``SizingFailure`` names
    the cell (the sweep fails)."""
    from cpsim.run.distrun import Entry

    prof = profile or profiles.for_abis([k.abi for k in (kernels or {}).values()])
    entries, skipped = [], {}
    for cell in cells(matrix):
        raw = _builder(cell, matrix["seed"], matrix.get("allow_large", False))
        try:
            s = raw(0)
        except ConfigError as e:
            skipped[cell.label] = f"invalid: {e}"
            continue
        try:
            s = profiles.scenario_for(s, prof)
        except ConfigError as e:
            skipped[cell.label] = f"not expressible under profile {prof.name}: {e}"
            continue

        def build(replica: int, raw=raw) -> sc.Scenario:
            return profiles.scenario_for(raw(replica), prof)
        n = s.cp.world
        if world is not None and n > world:
            skipped[cell.label] = f"needs {n} ranks, the job has {world}"
            continue
        knobs = Knobs()
        if sizer is not None:
            try:
                knobs = Knobs(host_sizing=sizer.answer(s, matrix["paths"]))
            except SizingFailure as e:
                raise SizingFailure(f"cell {cell.label}: {e}") from None
        entries.append(Entry(cell.label, build, n, matrix["paths"], knobs=knobs, kernels=kernels or {}, profile=prof))
    if not entries:
        raise ConfigError("sweep", "every cell was skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    return entries, skipped


def main(args) -> int:
    matrix = load_matrix(args)
    world = int(os.environ["WORLD_SIZE"]) if launched_by_torchrun() else None
    from cpsim.run.dist import select_device
    kernels = kernels_from_args(args, select_device(args.device).device, matrix["paths"])
    prof = profile_from_args(args, kernels)
    sizer = sizer_from_args(args)
    try:
        entries, skipped = plan(matrix, world, kernels, prof, sizer)
    except SizingFailure as e:
        return sizing_failed(terminal.console(), e)
    finally:
        if sizer is not None:
            sizer.close()
    check_paths_apply([e.build(0) for e in entries], matrix["paths"], args, explicit=matrix["paths_given"])
    console = terminal.console()
    progress = _progress(console, args.quiet, len(entries))
    if world is None:
        results = run_virtual_sweep(args, entries, progress)
        return finish(console, args, results, skipped, None, world, kernels, prof)
    from cpsim.run.distrun import execute

    def report_(results, infos) -> int:
        return finish(console, args, results, skipped, infos, world, kernels, prof)

    stopped = rank0_writer(ReportFiles.from_args(args), f"sweep on {world} ranks", subjects_for(kernels or {}, matrix["paths"]), len(entries),
                          {"mode": "sweep-torchrun", "skipped": skipped})
    return execute(args, entries, report_, progress=progress.advance if progress else None, stopped=stopped,
                   runner=kernel_runner(args))


class _Bar:
    def __init__(self, console: Console, total: int):
        from rich.progress import Progress, TextColumn

        self.p = Progress(*columns("[bold]sweep"), TextColumn("{task.description}"), console=console,
                          transient=True)
        self.task = self.p.add_task("", total=total)
        self.p.start()

    def advance(self, i: int, entry) -> None:
        self.p.update(self.task, advance=1, description=entry.label)
        if self.p.finished:
            self.p.stop()


def _progress(console: Console, quiet: bool, total: int) -> _Bar | None:
    """A progress bar on a terminal only (and on rank 0 only under torchrun)."""
    if quiet or not console.is_terminal or os.environ.get("RANK", "0") != "0":
        return None
    return _Bar(console, total)


def run_virtual_sweep(args, entries, progress):
    from cpsim.allocator import allocate_world
    from cpsim.run.dist import select_device
    from cpsim.run.distrun import GroupResult
    from cpsim.run.world import run_virtual

    dev = select_device(args.device)
    results = []
    for i, e in enumerate(entries):
        s = e.build(0)
        gathered = run_virtual(s, e.paths, e.knobs, device=dev.device, kernels=e.kernels, runner=kernel_runner(args))
        verdicts = coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world, e.profile)
        verdicts += [v for p in e.paths if p not in gathered
                     for v in coordinator.not_run(p, f"not applicable at CP world size {s.cp.world}")]
        results.append(GroupResult(e.label, 0, list(range(s.cp.world)), s, verdicts,
                                   [p for p in e.paths if p not in gathered]))
        if progress:
            progress.advance(i, e)
    return results


def junit_label(r) -> str:
    return f"{r.label} [seed {r.scenario.seed}]"


def finish(console: Console, args, results, skipped: dict, infos, world: int | None,
           kernels: dict | None = None, prof=None) -> int:
    from cpsim.report.torchrun import print_groups

    ok = all(coordinator.passed(r.verdicts) for r in results)
    held = kernel_standings(kernels)
    t = Table(title=f"sweep: {len(results)} scenario run(s)"
                    + (f" on {world} ranks" if world else " (virtual world)"), title_justify="left")
    for col in ("scenario", "CP", "ranks", "seed", "result"):
        t.add_column(col)
    for r in results:
        bad = sum(v.count for v in r.verdicts if v.status == "fail")
        cp = r.scenario.cp
        t.add_row(r.label, f"{cp.dcp}x{cp.pcp}", f"{r.ranks[0]}-{r.ranks[-1]}", str(r.scenario.seed),
                  "[green]pass[/green]" if coordinator.passed(r.verdicts) else f"[bold red]FAIL {bad}[/bold red]")
    for label, why in skipped.items():
        t.add_row(label, "", "", "", f"[dim]skipped: {why}[/dim]")
    console.print(t)
    failing = [r for r in results if not coordinator.passed(r.verdicts)]
    subjects = subjects_for(kernels or {}, dict.fromkeys(v.path for r in results for v in r.verdicts
                                                         if v.path != "*" and "~" not in v.path),
                            prof.name if prof else None)
    if failing and not args.quiet:
        print_groups(console, failing, subjects, getattr(args, "examples", None))
    if not args.quiet and results:
        describe_kernels(console, kernels or {}, notes_only=bool(failing))
    if prof is not None and not args.quiet:
        show_profile(console, prof)
    if getattr(args, "sizing", None) and not args.quiet:
        console.print(f"host sizing under test: {args.sizing} (asked for every cell)", highlight=False,
                      markup=False, soft_wrap=True)
    console.print("[bold green]every scenario passes[/bold green]" if ok else
                  f"[bold red]{len(failing)} of {len(results)} scenario run(s) fail[/bold red]")
    print_contracts(console, held, quiet=args.quiet)

    def json_() -> None:
        from cpsim.report.torchrun import to_dict
        report.write_json(args.json, to_dict(results, infos or [], {
            "mode": "sweep" if world is None else "sweep-torchrun", "skipped": skipped,
            "profile": prof.name if prof else "cpsim", "sizing": getattr(args, "sizing", None),
            "contracts": {p: st.to_dict() for p, st in held.items()}}, subjects))

    def junit() -> None:
        from cpsim.report.junit import write_junit
        write_junit(args.junit, [(r.scenario, r.verdicts, junit_label(r)) for r in results], skipped, subjects)

    def html() -> None:
        from cpsim.report.html import write_html_many
        write_html_many(args.html, f"sweep of {len(results)} scenario run(s)"
                        + (f" on {world} ranks" if world else " (virtual world)"),
                        [(f"{junit_label(r)} · ranks {r.ranks[0]}-{r.ranks[-1]}", r.scenario, r.verdicts)
                         for r in results], skipped, subjects=subjects)

    sys.stdout.flush()
    try:  # every output that can be written is, even when another fails
        write_outputs([("--json", args.json, json_), ("--junit", args.junit, junit), ("--html", args.html, html)])
    except ConfigError as e:
        terminal.console(stderr=True).print(f"[bold red]error:[/bold red] {e}", highlight=False, soft_wrap=True)
        return 2
    return status(ok, held)

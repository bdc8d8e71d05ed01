"""`cpsim draw`: a picture of one scenario's CP layout (PNG or SVG).

Exit code as for `run`: 0 when every invariant holds, 1 when the picture shows violations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from cpsim.report import terminal

from cpsim.allocator import allocate_world
from cpsim.check import coordinator, profiles
from cpsim import scenario as sc
from cpsim.cmd.options import KERNEL_FLAGS
from cpsim.cmd.contracts import subjects_for
from cpsim.cmd.inputs import (apply_overrides, check_paths_apply, kernel_runner, kernels_from_args,
                              kernels_with_record, knobs_with_sizing, parse_paths, profile_from_args,
                              scenario_from_args, sizer_from_args, sizing_failed)
from cpsim.errors import ConfigError
from cpsim.paths import Knobs
from cpsim.report import layout_picture, figure
from cpsim.run.world import run_virtual
from cpsim.validate import load_scenario
from cpsim.run.host_sizer import SizingFailure

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


def _fault(name: str):
    from cpsim import faults
    return faults.get(name, "--inject")


def _repro_data(path: str) -> dict:
    return json.loads(Path(path).read_text()) if Path(path).suffix == ".json" else {}


def _repro(path: str) -> tuple[sc.Scenario, Knobs, int | None]:
    """A repro file: the scenario, plus optional "knobs" (Knobs fields) and "inject_rank"."""
    s = load_scenario(path)
    data = _repro_data(path)
    knobs = Knobs()
    if isinstance(data.get("knobs"), dict):
        try:
            knobs = Knobs(**data["knobs"])
        except TypeError as e:
            raise ConfigError("--repro", f"{path}: bad knobs ({e})") from None
    rank = data.get("inject_rank")
    return s, knobs, (int(rank) if rank is not None else None)


def resolve(args) -> tuple[sc.Scenario, Knobs, int | None]:
    """Scenario, knobs and injected rank from --scenario / --repro / --inject."""
    if args.repro and args.scenario:
        raise ConfigError("--repro", "give either --scenario or --repro, not both")
    knobs, rank = Knobs(), None
    fault = _fault(args.inject) if args.inject else None
    if args.repro:
        s, knobs, rank = _repro(args.repro)
        s = apply_overrides(s, args)
    elif args.scenario or fault is None:
        args.scenario = args.scenario or "default"
        s = scenario_from_args(args)
    else:
        s = apply_overrides(fault.trigger(), args)
    if fault is not None:
        knobs = fault.knobs_for(s)
    return s, knobs, rank


def _kernels(args, paths: list[str]) -> dict:
    """The --kernel-* options, over the kernels a repro records (which must load, else exit 2)."""
    record = _repro_data(args.repro).get("kernels") if args.repro else None
    if record is not None and not isinstance(record, dict):
        raise ConfigError("--repro", f"{args.repro}: kernels must be {{path: 'builtin' | {{spec, abi, ...}}}}, "
                                     f"got {record!r}")
    if record:
        return kernels_with_record(args, record, "cpu", paths)
    return kernels_from_args(args, "cpu", paths)


def main(args) -> int:
    out = Path(args.out)
    if out.suffix.lower() not in (".png", ".svg"):
        raise ConfigError("--out", f"must end in .png or .svg, got {out.name!r}")
    if args.capture:
        given = [f for f, attr in [*KERNEL_FLAGS.items(), ("replay", "kernel_replay")] if getattr(args, attr, None)]
        if given:
            raise ConfigError(f"--kernel-{given[0]}", "a capture holds what the kernels wrote; draw --capture runs "
                                                       "no kernel (drop the --kernel-* options)")
        from cpsim.capture.picture import main as draw_capture
        return draw_capture(args)
    s, knobs, rank = resolve(args)
    paths = parse_paths(args.paths)
    kernels = _kernels(args, paths)
    if kernels:
        check_paths_apply([s], paths, args, explicit=False)
    data = _repro_data(args.repro) if args.repro else {}
    prof = profile_from_args(args, kernels, data.get("profile") or "")
    recorded = data.get("sizing") or ""
    if not isinstance(recorded, str):
        raise ConfigError("repro.sizing", f"{args.repro}: must be a SPEC string, got {recorded!r}")
    sizer = sizer_from_args(args, recorded)
    if sizer is not None:
        try:
            with sizer:  # asked for the scenario as the profile lays it out, as simulate runs it
                knobs = knobs_with_sizing(args, knobs, profiles.scenario_for(s, prof), paths, sizer)
        except SizingFailure as e:
            return sizing_failed(terminal.console(), e)
    pic = simulate(s, paths, knobs, rank, kernels, prof, kernel_runner(args))
    fig = figure.render(pic, args.title, subjects=subjects_for(kernels, paths, prof.name))
    figure.save(fig, out)
    ok = coordinator.passed(pic.verdicts)
    if not args.quiet:
        n = sum(len(v.violations) for v in pic.verdicts)
        terminal.console().print(f"wrote {out} ({out.stat().st_size // 1024} KiB): "
                                 + ("all invariants hold" if ok else f"[red]{n} violation(s) drawn[/red]")
                                 + f"; profile {prof.name}", highlight=False)
    return 0 if ok else 1


def simulate(s: sc.Scenario, paths: list[str] | tuple[str, ...] = layout_picture.DEFAULT_PATHS, knobs: Knobs = Knobs(),
             inject_rank: int | None = None, kernels: dict | None = None, profile=None, runner=None) -> layout_picture.Picture:
    """Run the virtual world (with the user's ``kernels``, if any, on ``runner``: ``run_virtual``'s), check it
    by ``profile`` (None: cpsim's model; it lays the scenario out too), and lay out the picture's data."""
    if profile is not None:
        s = profiles.scenario_for(s, profile)
    refs = layout_picture.check_size(s)  # before any kernel runs: a scenario too big to draw is refused
    allocs = allocate_world(s)
    gathered = run_virtual(s, list(paths), knobs, inject_rank, kernels=kernels, allocs=allocs, runner=runner)
    verdicts = coordinator.check(s, allocs, gathered, [s.fingerprint()] * s.cp.world, profile)
    pic = layout_picture.build(s, gathered, allocs, verdicts, list(paths), refs)
    pic.skipped = [p for p in paths if p not in gathered]
    return pic


def figure_for(s: sc.Scenario, paths: list[str] | tuple[str, ...] = layout_picture.DEFAULT_PATHS, knobs: Knobs = Knobs(),
               inject_rank: int | None = None, title: str = "", runner=None) -> tuple["Figure", layout_picture.Picture]:
    pic = simulate(s, paths, knobs, inject_rank, runner=runner)
    return figure.render(pic, title), pic

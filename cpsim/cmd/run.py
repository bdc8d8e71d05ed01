"""``cpsim run``: one scenario, every selected path, every CP rank, one verdict."""

from __future__ import annotations

from rich.console import Console

from cpsim import coordinator, report
from cpsim.allocator import allocate_world
from cpsim.cmd import (add_kernel_args, add_path_args, add_scenario_args, describe_kernels, kernels_from_args,
                       parse_paths, scenario_from_args)
from cpsim.progress import progress
from cpsim.world import run_virtual

# Below this many (token x rank x path) kernel entries a run is too quick for a bar.
PROGRESS_MIN_WORK = 200_000


def register(sub) -> None:
    p = sub.add_parser("run", help="check one scenario on every CP rank (virtual world or torchrun)")
    add_scenario_args(p)
    add_path_args(p)
    add_kernel_args(p)
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON (docs/REPORT_SCHEMA.md)")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report (with the picture "
                                                   "when the scenario is small enough to draw)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML: one testcase per path, group and invariant")
    p.add_argument("--quiet", action="store_true", help="print only the verdict line; no progress bar")
    p.set_defaults(func=main)


def main(args) -> int:
    s = scenario_from_args(args)
    paths = parse_paths(args.paths)
    kernels = kernels_from_args(args, paths=paths)
    console = Console()
    work = s.cp.world * len(paths)
    quiet = args.quiet or s.batch.num_tokens * work < PROGRESS_MIN_WORK
    with progress(f"{s.name}: paths x ranks", total=work, quiet=quiet, console=console) as bar:
        gathered = run_virtual(s, paths, kernels=kernels,
                               on_rank=lambda path, r: bar.advance(label=f"{path} rank {r}"))
    skipped = [p for p in paths if p not in gathered]
    allocs = allocate_world(s)
    verdicts = coordinator.check(s, allocs, gathered, [s.fingerprint()] * s.cp.world)
    if not args.quiet:
        report.print_report(console, s, verdicts)
        for p in skipped:
            console.print(f"[dim]{p}: not applicable at CP world size {s.cp.world} (CP size 1 only)[/dim]")
        describe_kernels(console, kernels)
    else:
        console.print("pass" if coordinator.passed(verdicts) else "FAIL")
    if args.json:
        report.write_json(args.json, report.to_dict(s, verdicts, {"paths_skipped": skipped, "kernels": {
            p: {"spec": k.spec, "abi": k.abi, "notes": k.notes} for p, k in kernels.items()}}))
    if args.junit:
        from cpsim.junit import write_junit
        write_junit(args.junit, [(s, verdicts)])
    if args.html:
        from cpsim.html_report import picture_for, write_html
        png, note = picture_for(s, gathered, allocs, verdicts)
        write_html(args.html, s, verdicts, png, {"paths_skipped": skipped}, picture_note=note)
    return 0 if coordinator.passed(verdicts) else 1

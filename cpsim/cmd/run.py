"""``cpsim run``: one scenario, every selected path, every CP rank, one verdict."""

from __future__ import annotations

from rich.console import Console

from cpsim import coordinator, report
from cpsim.allocator import allocate_world
from cpsim.cmd import add_path_args, add_scenario_args, parse_paths, scenario_from_args
from cpsim.paths import KERNEL_DESIGNS, Knobs
from cpsim.world import run_virtual


def register(sub) -> None:
    p = sub.add_parser("run", help="check one scenario on every CP rank (virtual world or torchrun)")
    add_scenario_args(p)
    add_path_args(p)
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.add_argument("--quiet", action="store_true", help="print only the verdict line")
    p.add_argument("--kernel-design", choices=KERNEL_DESIGNS, default="per-request",
                   help="Triton kernel design: per-request (vllm-ascend-faithful) or tile (tile-parallel)")
    p.set_defaults(func=main)


def main(args) -> int:
    s = scenario_from_args(args)
    paths = parse_paths(args.paths)
    console = Console()
    gathered = run_virtual(s, paths, Knobs(kernel_design=getattr(args, "kernel_design", "per-request")))
    skipped = [p for p in paths if p not in gathered]
    verdicts = coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world)
    if not args.quiet:
        report.print_report(console, s, verdicts)
        for p in skipped:
            console.print(f"[dim]{p}: not applicable at CP world size {s.cp.world} (CP size 1 only)[/dim]")
    else:
        console.print("pass" if coordinator.passed(verdicts) else "FAIL")
    if args.json:
        report.write_json(args.json, report.to_dict(s, verdicts, {"paths_skipped": skipped}))
    return 0 if coordinator.passed(verdicts) else 1

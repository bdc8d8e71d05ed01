"""``cpsim run``: one scenario, every selected path, every CP rank, one verdict."""

from __future__ import annotations

from rich.console import Console

from cpsim import coordinator, report
from cpsim.allocator import allocate_world
from cpsim.cmd import add_path_args, add_scenario_args, parse_paths, scenario_from_args
from cpsim.errors import ConfigError
from cpsim.paths import Knobs
from cpsim.world import run_virtual


def register(sub) -> None:
    p = sub.add_parser("run", help="check one scenario on every CP rank (virtual world or torchrun)")
    add_scenario_args(p)
    add_path_args(p)
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.add_argument("--quiet", action="store_true", help="print only the verdict line")
    p.add_argument("--inject", metavar="NAME", help="inject a catalogue fault (see `cpsim bugs list`)")
    p.add_argument("--inject-on-rank", type=int, metavar="R", help="inject it on CP rank R only")
    p.set_defaults(func=main)


def main(args) -> int:
    s = scenario_from_args(args)
    paths = parse_paths(args.paths)
    console = Console()
    knobs, inject_rank = _injection(args, s)
    gathered = run_virtual(s, paths, knobs, inject_rank)
    skipped = [p for p in paths if p not in gathered]
    verdicts = coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world)
    if not args.quiet:
        report.print_report(console, s, verdicts)
        for p in skipped:
            console.print(f"[dim]{p}: not applicable at CP world size {s.cp.world} (CP size 1 only)[/dim]")
    else:
        console.print("pass" if coordinator.passed(verdicts) else "FAIL")
    if args.json:
        report.write_json(args.json, report.to_dict(s, verdicts, {"paths_skipped": skipped, "inject": args.inject,
                                                                  "inject_rank": inject_rank}))
    return 0 if coordinator.passed(verdicts) else 1


def _injection(args, s) -> tuple[Knobs, int | None]:
    rank = getattr(args, "inject_on_rank", None)
    if not getattr(args, "inject", None):
        if rank is not None:
            raise ConfigError("--inject-on-rank", "needs --inject NAME")
        return Knobs(), None
    from cpsim import faults
    fault = faults.get(args.inject, "--inject")
    if rank is not None and not 0 <= rank < s.cp.world:
        raise ConfigError("--inject-on-rank", f"must lie in [0, {s.cp.world}) (CP world size {s.cp.world})")
    return fault.knobs_for(s), rank

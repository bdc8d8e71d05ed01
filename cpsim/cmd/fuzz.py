"""``cpsim fuzz``: search the scenario space, shrink a violation, write a repro file."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.text import Text

from cpsim import fuzz as fz
from cpsim.report import report
from cpsim.cmd import add_kernel_args, add_path_args, describe_kernels, kernels_from_args, parse_paths


def register(sub) -> None:
    p = sub.add_parser("fuzz", help="search random scenarios for a violation; shrink it; write a repro file")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--max-examples", type=int, default=300, metavar="N",
                        help="scenarios to try per round (default: 300)")
    budget.add_argument("--minutes", type=float, metavar="M",
                        help="keep searching in rounds of 100 examples until M minutes have passed")
    p.add_argument("--seed", type=int, help="Hypothesis seed: the same seed gives the same run. Hypothesis then neither "
                                            "reads nor writes the example database (default: random, database on)")
    add_path_args(p, default=",".join(fz.DEFAULT_PATHS))
    p.add_argument("--inject", metavar="NAME", help="inject a catalogue fault (see `cpsim fuzz --list-faults`)")
    p.add_argument("--list-faults", action="store_true", help="print the fault names --inject accepts and exit")
    add_kernel_args(p)  # recorded in the repro file, so `cpsim replay` loads the same kernels
    p.add_argument("--allow-invalid", action="store_true",
                   help="also draw CP layouts that break the global owner rule (interleave not dividing B)")
    p.add_argument("--out", default="out", metavar="DIR", help="where repro-<fingerprint>.json goes (default: out)")
    p.add_argument("--db", default=str(fz.DEFAULT_DB), metavar="DIR",
                   help="Hypothesis example database, so a rerun starts from known failures (default: .cpsim/hypothesis)")
    p.add_argument("--no-db", action="store_true", help="do not read or write the example database")
    p.add_argument("--max-programs", type=int, default=48, metavar="P",
                   help="bound on CP world x groups x (requests + 1), the interpreter programs one path "
                        "launches per scenario; larger worlds get fewer requests (default 48)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=main)


def _status(prog: fz.Progress) -> Text:
    shrink = ""
    if prog.shrink:
        z = prog.shrink
        shrink = (f"  smallest failing: CP {z['world']}, {z['groups']} group(s), "
                  f"{z['requests']} request(s), {z['tokens']} token(s)")
    return Text(f"{prog.phase}: {prog.examples} examples, {prog.rate:.1f}/s, "
                f"{prog.failures} failing run(s){shrink}")


def main(args) -> int:
    if args.list_faults:
        print("\n".join(fz.fault_names()))
        return 0
    console = Console()
    paths = parse_paths(args.paths)
    kernels = kernels_from_args(args, "cpu", paths)
    cfg = fz.FuzzConfig(
        paths=paths, kernels=kernels, inject=args.inject, max_examples=args.max_examples if not args.minutes else 100,
        minutes=args.minutes, seed=args.seed, allow_invalid=args.allow_invalid, out=Path(args.out),
        database=None if args.no_db else Path(args.db), max_programs=args.max_programs,
    )
    fz.resolve_fault(cfg.inject)  # bad names fail before the search starts
    live = not args.quiet and console.is_terminal
    if live:
        with Live(Text("starting"), console=console, refresh_per_second=4, transient=True) as view:
            last = [0.0]

            def show(prog: fz.Progress) -> None:
                now = time.monotonic()
                if now - last[0] > 0.2:
                    last[0] = now
                    view.update(_status(prog))

            result = fz.fuzz(cfg, show)
    else:
        result = fz.fuzz(cfg)
    if not args.quiet:
        describe_kernels(console, kernels)
    head = f"{result.examples} examples in {result.elapsed_s:.1f} s ({result.examples / max(result.elapsed_s, 1e-9):.1f}/s)"
    if not result.found:
        console.print(f"{head}: [bold green]no violation found[/bold green]"
                      + (f" with {cfg.inject} injected" if cfg.inject else ""))
        return 0
    out = result.outcome
    console.print(f"{head}: [bold red]violation[/bold red] ({', '.join(out.invariants())}); "
                  f"minimal scenario: {fz.size(result.scenario)}", highlight=False)
    if not args.quiet:
        if out.error:
            console.print(f"[red]error:[/red] {out.error}", highlight=False)
        else:
            report.print_report(console, result.scenario, out.verdicts)
    console.print(f"repro written to {result.repro}; rerun with: cpsim replay {result.repro}", highlight=False)
    return 1

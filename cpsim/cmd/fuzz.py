"""`cpsim fuzz`: search the scenario space, keep every distinct violation, shrink each, write repros.

Failures are grouped by signature (path, group kind, failed invariants, triggering
dimension); the run keeps searching after the first one (`--stop-after-first`:
the old behaviour) and ends with a table of signatures and one repro file each.
Under torchrun (`launch/local.sh N fuzz ...`) every rank fuzzes its own seed
stream on its own device, independently: no collective, so no rank can hang another.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from cpsim.report import terminal
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cpsim import fuzz as fz
from cpsim.errors import Interrupted
from cpsim.cmd.contracts import describe_kernels, kernel_standings, print_contracts, show_profile, status
from cpsim.cmd.inputs import (kernel_runner, kernels_from_args, parse_paths, profile_from_args, sizer_from_args,
                              sizing_failed)
from cpsim.report.progress import eta
from cpsim.run.host_sizer import SizingFailure


def _status(prog: fz.Progress, budget: int = 0) -> Text:
    """One live line: phase, examples and rate, signatures found, eta against the --max-examples budget."""
    left = f", eta {eta(prog.examples, budget, time.monotonic() - prog.started)}" if budget else ""
    shrink = ""
    if prog.shrink:
        z = prog.shrink
        shrink = (f"  smallest failing: CP {z['world']}, {z['groups']} group(s), "
                  f"{z['requests']} request(s), {z['tokens']} token(s)")
    return Text(f"{prog.phase}: {prog.drawn}/{budget or '?'} examples drawn, {prog.shrink_runs} shrink runs, "
                f"{prog.rate:.1f} runs/s{left}, "
                f"{prog.signatures} signature(s), {prog.failures} failing run(s){shrink}")


def _jobs_status(started: float, status: dict, budget: int = 0) -> Text:
    n = sum(v[0] for v in status.values())
    parts = ", ".join(f"job {j}: {v[0]} ({v[2]})" for j, v in sorted(status.items()))
    left = f", eta {eta(n, budget, time.monotonic() - started)}" if budget else ""
    return Text(f"{n}/{budget or '?'} examples, {n / max(time.monotonic() - started, 1e-9):.1f}/s{left}; {parts}")


def _size_text(f: fz.Finding) -> str:
    z = fz.size(f.scenario)
    blocks = max(g.num_blocks for g in f.scenario.groups)
    return (f"CP {z['world']}, {z['groups']} grp, {z['requests']} req, {z['tokens']} tok, "
            f"{blocks} blocks" + ("" if f.shrunk else " (not shrunk)"))


def signature_table(result: fz.FuzzResult) -> Table:
    t = Table(title=f"{len(result.reported)} signature(s)", title_justify="left")
    for col in ("#", "signature (path:group kind:invariants:dimension)", "first seen after", "shrunk to", "repro"):
        t.add_column(col, overflow="fold")
    for i, f in enumerate(result.reported, 1):
        seen = f"{f.first_seen} scenarios" + (f" (job {f.job})" if result.jobs > 1 or f.job else "")
        t.add_row(str(i), f.signature, seen, _size_text(f), str(f.repro) if f.repro else "-")
    return t


def _torchrun_stream(args) -> tuple[int, str]:
    """Under torchrun: (this rank's seed stream, device); each rank searches on its own."""
    from cpsim.run.dist import Env, launched_by_torchrun

    if not launched_by_torchrun():
        return 0, args.device
    env = Env.from_environ()
    dev = args.device if args.device == "cpu" else f"{args.device}:{env.local_rank}"
    return env.rank, dev


def main(args) -> int:
    if args.list_faults:
        print("\n".join(fz.fault_names()))
        return 0
    console = terminal.console()
    paths = parse_paths(args.paths)
    fz.resolve_fault(args.inject)  # bad names fail before the search starts
    stream, device = _torchrun_stream(args)
    from cpsim.run.dist import select_device
    dev = select_device(device.split(":")[0], int(device.split(":")[1]) if ":" in device else 0,
                        int(os.environ.get("LOCAL_WORLD_SIZE", 1)), oversubscribe=True)
    kernels = kernels_from_args(args, str(dev.device), paths)
    ignore = list(args.ignore) + (fz.load_known(args.known) if args.known else [])
    sizer = sizer_from_args(args)
    if sizer is not None:  # a SPEC that does not load is exit 2 (exit 1 if its import fails) before any search
        try:
            with sizer:
                sizer.check()
        except SizingFailure as e:
            return sizing_failed(console, e)
    out = fz.check_out_dir(args.out)
    if not args.no_db:
        fz.check_db_dir(args.db)
    cfg = fz.FuzzConfig(
        paths=paths, kernels=kernels, inject=args.inject,
        max_examples=args.max_examples if not args.minutes else 100, minutes=args.minutes, seed=args.seed,
        allow_invalid=args.allow_invalid, out=out, database=None if args.no_db else Path(args.db),
        max_programs=args.max_programs, shrink_seconds=args.shrink_seconds, device=str(dev.device),
        space="extreme" if args.extreme else "default", stop_after_first=args.stop_after_first,
        ignore=ignore, jobs=args.jobs, seed_stream=stream, explore=args.explore,
        summary_name=f"fuzz-summary-rank{stream}.json" if stream else "fuzz-summary.json",
        profile=profile_from_args(args, kernels).name,
        sizing=args.sizing or "", sizing_timeout=args.sizing_timeout,
    )
    where = f"rank {stream}: " if stream else ""
    if not args.quiet:
        console.print(f"{where}space searched: {cfg.describe_space()}; device {dev.device}; "
                      f"scenarios drawn by {cfg.explorer()}"
                      + (f"; {cfg.jobs} jobs" if cfg.jobs > 1 else ""), highlight=False)
        show_profile(console, cfg.judged_by())
        if cfg.sizing:
            console.print(f"{where}host sizing under test: {cfg.sizing} (asked for every scenario)", highlight=False,
                          soft_wrap=True, markup=False)
    live = not args.quiet and console.is_terminal
    started = time.monotonic()
    early: set[Path] = set()  # repros written as their signature was first seen
    try:
        result = _search(cfg, live, console, started, early, kernel_runner(args))
    except (KeyboardInterrupt, Interrupted) as e:
        e.wrote = _keep_partial(cfg, e, early, started)
        raise
    except fz.JobEnded as e:
        return _job_ended(cfg, e, early, started)
    except fz.JobFailed as e:
        return _job_failed(cfg, e)
    problems = fz.write_findings(cfg, result)  # repros first, then the summary; never lost
    _drop_superseded(early, result)
    return _report(args, cfg, console, kernels, result, problems, where)


def _search(cfg: fz.FuzzConfig, live: bool, console, started: float, early: set[Path], runner) -> fz.FuzzResult:
    """The search, with the live status line on a terminal. One job writes each new signature's repro as
    soon as it is first seen (shrunk later, and replaced then), so an interrupt or a kill loses none; with
    ``--jobs N`` each job sends its new signatures here as it finds them, and this process writes them."""
    def found(f: fz.Finding, examples: int) -> None:
        try:
            early.add(fz.write_repro(cfg.out, fz.repro_of(cfg, f, examples)))
        except OSError:  # the final write names the problem
            pass

    if live:
        with Live(Text("starting"), console=console, refresh_per_second=4, transient=True) as view:
            last = [0.0]

            def show(prog: fz.Progress) -> None:
                now = time.monotonic()
                if now - last[0] > 0.2:
                    last[0] = now
                    view.update(_status(prog, cfg.max_examples))

            return (fz.search(cfg, show, found, runner) if cfg.jobs == 1 else
                    fz.search_jobs(cfg, lambda st: view.update(_jobs_status(started, st, cfg.max_examples)), found))
    return fz.search(cfg, on_found=found, runner=runner) if cfg.jobs == 1 else fz.search_jobs(cfg, on_found=found)


INTERNAL_ERROR = 3  # docs/RUNNING.md's exit-code table: cpsim itself failed


def _job_failed(cfg: fz.FuzzConfig, e: "fz.JobFailed") -> int:
    """A job process raised or died (a bug in cpsim, not a finding): one line naming the job and the
    cause, the job's traceback in a file under ``--out`` (named in the line), exit 3."""
    from rich.markup import escape
    where = ""
    if e.trace:
        path = Path(cfg.out) / f"fuzz-job-{e.job}-traceback.txt"
        try:
            path.write_text(e.trace)
            where = f"; its traceback is in {path}"
        except OSError as err:
            where = f"; its traceback could not be written to {path} ({err.strerror or err})"
    terminal.console(stderr=True).print(
        f"[bold red]internal error:[/bold red] {escape(f'fuzz job {e.job} failed: {e.cause}{where}')}",
        highlight=False, soft_wrap=True)
    return INTERNAL_ERROR


def _job_ended(cfg: fz.FuzzConfig, e: "fz.JobEnded", early: set[Path], started: float) -> int:
    """A job ended by a signal cpsim did not send (its kernel's deed): the findings so far and the summary
    (saying so) are kept, one line names the job and the signal, exit 1: never a pass, not cpsim's error."""
    from rich.markup import escape
    wrote = _keep_partial(cfg, e, early, started, why=e.why)
    terminal.console(stderr=True).print(
        f"[bold red]FAIL:[/bold red] {escape(str(e))}" + (f"; {', '.join(wrote)} say so" if wrote else ""),
        highlight=False, soft_wrap=True)
    return 1


def _drop_superseded(early: set[Path], result: fz.FuzzResult) -> None:
    """Remove the first-sighting repros whose signature ended with another (smaller) scenario's file."""
    final = {f.repro for f in result.findings if f.repro}
    for path in early - final:
        path.unlink(missing_ok=True)


def _keep_partial(cfg: fz.FuzzConfig, e: BaseException, early: set[Path], started: float,
                  why: str | None = None) -> list[str]:
    """Ctrl-C or SIGTERM (or ``why`` the search stopped): write the repros and the summary of what was found
    so far (the summary says it was interrupted); the files written, for the CLI's one line."""
    import signal
    name = why or ("SIGINT" if isinstance(e, KeyboardInterrupt) else signal.Signals(e.signum).name)
    partial = getattr(e, "partial", None) or fz.FuzzResult(0, time.monotonic() - started, [], cfg.space, cfg.jobs)
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}  # a second one waits
    try:
        problems = fz.write_findings(cfg, partial, interrupted=name)
        _drop_superseded(early, partial)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    summary = Path(cfg.out) / cfg.summary_name
    wrote = [str(summary)] if summary.exists() and not any(str(summary) in x for x in problems) else []
    n = len(partial.reported)
    return wrote + ([f"{n} repro(s) in {cfg.out}"] if n else [])


def _report(args, cfg: fz.FuzzConfig, console, kernels: dict, result: fz.FuzzResult, problems: list[str],
            where: str) -> int:
    if not args.quiet:
        describe_kernels(console, kernels)
    held = kernel_standings(kernels)
    print_contracts(console, held, quiet=args.quiet)
    rate = result.examples / max(result.elapsed_s, 1e-9)
    head = (f"{where}{result.drawn} examples drawn and {result.shrink_runs} shrink runs in {result.elapsed_s:.1f} s "
            f"({rate:.1f} runs/s"
            + (f", {cfg.jobs} jobs" if cfg.jobs > 1 else "") + f"), space {cfg.space}, "
            f"{result.not_expressible} not expressible under profile {cfg.judged_by().name} (left out)")
    ignored = [f for f in result.findings if f.ignored]
    if ignored:
        console.print(f"{where}ignored {len(ignored)} known signature(s): "
                      + ", ".join(f.signature for f in ignored), highlight=False, soft_wrap=True)
    for line in problems:
        console.print(f"[bold red]error:[/bold red] {line}", highlight=False, soft_wrap=True)
    if not result.found:
        console.print(f"{head}: [bold green]no violation found[/bold green]"
                      + (f" with {cfg.inject} injected" if cfg.inject else ""), highlight=False)
        return status(True, held)
    console.print(f"{head}: [bold red]{len(result.reported)} distinct violation(s)[/bold red]", highlight=False)
    if not args.quiet:
        for f in result.reported:
            console.print(f"\n[bold]{f.signature}[/bold]", highlight=False)
            if f.summary.get("error"):
                console.print(f"[red]error:[/red] {f.summary['error']}", highlight=False)
            else:
                for x in f.summary.get("failures", []):
                    console.print(f"  {x['invariant']} on {x['path']}: {x['count']} violation(s); "
                                  + "; ".join(x["messages"][:2]), highlight=False, soft_wrap=True)
    console.print(signature_table(result))
    console.print(f"rerun one with: cpsim replay {result.reported[0].repro}", highlight=False)
    return 1

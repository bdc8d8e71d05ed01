"""A sub-command's check on every CP group of a torchrun world: rank 0's report and outputs, also when
the job stops early."""

from __future__ import annotations

import os
from typing import Callable

from cpsim.cmd.contracts import Judged, print_contracts, status
from cpsim.errors import ConfigError
from cpsim.report.outputs import ReportFiles
from cpsim.validate import write_outputs
from cpsim.report import terminal


# ---- torchrun ------------------------------------------------------------------

def execute_torchrun(args, entry, judged: Judged, files: ReportFiles, runner, summary: Callable | None = None,
                     extra: dict | None = None) -> int:
    """Check one ``distrun.Entry`` on every CP group of the torchrun world.

    Rank 0 prints the ranks, every group's report and the kernels under test, then
    ``summary(console, results)`` (a command's own verdict line), and writes the
    --json / --junit / --html files the command has. Exit 1 when any group fails.
    ``judged``: what judges the entry's kernels, as the command worked it out; ``files`` and ``runner``: the
    command's report files and kernel runner.
    """
    from cpsim.check import coordinator
    from cpsim.report.torchrun import print_groups
    from cpsim.run.distrun import execute, print_ranks

    world = int(os.environ["WORLD_SIZE"])
    quiet = files.quiet
    prof = entry.profile
    subjects, held = judged.subjects(), judged.held
    if held:
        extra = {**(extra or {}), "contracts": judged.contracts()}

    write = rank0_writer(files, f"{entry.label} on torchrun world {world}", subjects, 1, extra)

    def report_(results, infos) -> int:
        console = terminal.console()
        ok = all(coordinator.passed(r.verdicts) for r in results)
        s0 = results[0].scenario
        if quiet:
            console.print("pass" if ok else "FAIL")
        else:
            console.print(f"[bold]torchrun world {world}[/bold]: {world // entry.cp_size} CP group(s) of "
                          f"{entry.cp_size} (DCP {s0.cp.dcp} x PCP {s0.cp.pcp}), timeout {args.timeout:g} s")
            print_ranks(console, infos, results)
            print_groups(console, results, subjects, files.examples)
            judged.describe(console, profile=prof is not None)
            console.print(f"[bold green]all {len(results)} CP group(s) pass[/bold green]" if ok else
                          f"[bold red]{sum(not coordinator.passed(r.verdicts) for r in results)} of "
                          f"{len(results)} CP group(s) fail[/bold red]")
        print_contracts(console, held, quiet=quiet)
        if summary is not None:
            summary(console, results)
        return status(ok, held) if write(results, infos) else 2

    return execute(args, [entry], report_, stopped=write, runner=runner)


def rank0_writer(files: ReportFiles, title: str, subjects: dict, planned: int, extra: dict | None = None) -> Callable:
    """What rank 0 writes at the end of a torchrun job, ``write(results, infos)``: the --json / --junit / --html
    files the command has, each that can be written even when another fails (False: one could not be). When
    the job stopped early, ``write(results, infos, message, ranks)`` (``distrun.execute``'s ``stopped``): the
    files say the run stopped, with rank 0's stop line, the ranks it names and the CP groups finished so
    far; then one line names the files."""
    from rich.markup import escape

    from cpsim.report import report
    from cpsim.report.torchrun import stopped_record, to_dict

    def write(results, infos, message: str | None = None, ranks: list[int] = ()) -> bool:
        world = int(os.environ.get("WORLD_SIZE", len(infos)))
        record = None if message is None else stopped_record(message, ranks, world, len({r.label for r in results}),
                                                             planned)
        items = [(r.scenario, r.verdicts, f"{r.label} group {r.group}") for r in results]

        def junit() -> None:
            from cpsim.report.junit import write_junit
            write_junit(files.junit, items, subjects=subjects, errors=None if message is None else {"torchrun": message})

        def html() -> None:
            from cpsim.report.html import write_html_many
            write_html_many(files.html, title, [(f"{r.label} · CP group {r.group} (ranks {r.ranks[0]}-{r.ranks[-1]})",
                                                r.scenario, r.verdicts) for r in results],
                            extra=extra, subjects=subjects, stopped=message)

        outputs = [("--json", files.json,
                    lambda: report.write_json(files.json, {**to_dict(results, infos, extra, subjects, record),
                                                          **({"world_size": world} if record else {})})),
                   ("--junit", files.junit, junit),
                   ("--html", files.html, html)]
        try:
            write_outputs(outputs)
        except ConfigError as e:
            terminal.console(stderr=True).print(f"[bold red]error:[/bold red] {e}", highlight=False, soft_wrap=True)
            return False
        written = [path for _, path, _ in outputs if path]
        if message is not None and written:
            named = ", ".join(f"rank {r}" for r in ranks) or "no rank"
            terminal.console(stderr=True).print(escape(f"[rank 0] the run stopped early; {', '.join(written)} "
                                                       f"say so ({named} named)"), highlight=False, soft_wrap=True)
        return True

    return write

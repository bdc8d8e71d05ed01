"""Progress bars for long commands, silent when nobody is watching.

A bar on a pipe or in a CI log is noise, so the helper is a no-op unless stdout is a
terminal and the caller did not ask for ``--quiet``. Commands use one shape:

    with progress("paths x ranks", total=n, quiet=args.quiet) as bar:
        ...; bar.advance()
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Console

from cpsim.report import terminal


class Bar:
    """What a command sees: advance by steps, optionally relabel the current step."""

    def __init__(self, progress=None, task=None):
        self._progress = progress
        self._task = task
        self.done = 0

    @property
    def active(self) -> bool:
        return self._progress is not None

    def advance(self, steps: int = 1, label: str | None = None) -> None:
        self.done += steps
        if self._progress is not None:
            kw = {"description": label} if label else {}
            self._progress.update(self._task, advance=steps, **kw)


def enabled(quiet: bool = False, console: Console | None = None) -> bool:
    console = console or terminal.console()
    return not quiet and console.is_terminal


@contextmanager
def progress(description: str, total: int | None, quiet: bool = False,
             console: Console | None = None) -> Iterator[Bar]:
    if not enabled(quiet, console):
        yield Bar()
        return
    from rich.progress import Progress

    with Progress(*columns(), console=console or terminal.console(), transient=True) as p:
        yield Bar(p, p.add_task(description, total=total))


def columns(label: str = "{task.description}") -> tuple:
    """label, bar, done/total, elapsed, "eta" remaining (from the rate so far), the same on every command."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    return (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"),
            TimeRemainingColumn())


def eta(done: int, total: int, elapsed: float) -> str:
    """Remaining time at the rate so far, as m:ss ("-:--" before the first step)."""
    if done <= 0 or total <= done:
        return "-:--" if done <= 0 else "0:00"
    left = int(elapsed * (total - done) / done)
    return f"{left // 60}:{left % 60:02d}"

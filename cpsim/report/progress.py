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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console or terminal.console(), transient=True) as p:
        yield Bar(p, p.add_task(description, total=total))

"""The consoles cpsim prints through: output that fits where it lands.

On a terminal rich wraps to the window, as it should. Off a terminal (a CI log, a
pipe, a file) rich would assume 80 columns and fold tables into ``to… sta… 12.…`` and
repro paths mid-name, so there we print at a wide fixed width: tables take their
natural width and lines are not folded. ``COLUMNS`` still wins when set.

``--format plain`` (``set_format("plain")``) is for logs that keep no colour: no
ANSI codes, no markup styling, ASCII table borders.
"""

from __future__ import annotations

import os

from rich import box
from rich.console import Console

# Wide enough that no table or path we print is folded; a terminal's own width wins.
WIDE = 1000
FORMATS = ("rich", "plain")
DEFAULT_EXAMPLES = 3  # examples printed per failing invariant (`--examples`)

_format = "rich"


def set_format(name: str) -> None:
    global _format
    if name not in FORMATS:
        raise ValueError(name)
    _format = name


def plain() -> bool:
    return _format == "plain"


def console(stderr: bool = False, **kw) -> Console:
    """A rich Console for stdout (or stderr) that does not fold its output off a terminal."""
    if plain():
        kw.setdefault("color_system", None)
        kw.setdefault("no_color", True)
        kw.setdefault("emoji", False)
    c = Console(stderr=stderr, **kw)
    if "width" not in kw and not c.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        c = Console(stderr=stderr, width=WIDE, **kw)
    return c


def table_box():
    """Table borders: rich's heavy-head box on a terminal, ASCII in plain format."""
    return box.ASCII if plain() else box.HEAVY_HEAD

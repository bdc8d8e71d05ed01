"""The oracle's invariants (docs/SPEC.md §4), a module per group of related ones.

Each is an :class:`Invariant`: its name, what it is judged over, when it applies, what it counts and
how it judges. ``cpsim.check.coordinator.ORACLE`` lists them in verdict order and runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def always(case) -> bool:
    return True


@dataclass(frozen=True)
class Invariant:
    """One invariant. ``scope``: "path", judged once per path that ran (over a ``context.PathCase``);
    "group", once per (path, group) (a ``context.GroupCase``), its counts and violations summed into the
    path's verdict; "paths", once per check (a ``context.AllPaths``), ``judge`` returning its verdicts.
    ``count``: the entries or items it examines where it applies. ``buffer_only``: decided by the group's
    slot buffer and the profile's rule for it alone, so a later path that hands in an equal buffer takes
    the earlier path's violations (``GroupCase.same_as``) instead of judging it again."""

    name: str
    scope: str
    judge: Callable
    applies: Callable = always
    count: Callable = lambda case: 0
    buffer_only: bool = False

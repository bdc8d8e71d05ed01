"""The bug catalogue (SPEC §5): real CP slot-mapping bugs as injectable faults.

Each fault is a set of :class:`cpsim.paths.Knobs` (the deviation from the correct
runtime), the smallest scenario that makes it visible, and the invariants the
coordinator is expected to report. ``Knobs()`` is the fixed form of every fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cpsim.errors import ConfigError
from cpsim.paths import Knobs
from cpsim.scenario import Scenario


@dataclass(frozen=True)
class Fault:
    name: str
    summary: str                      # one line, for tables
    explanation: str                  # one paragraph: what went wrong and why it matters
    references: tuple[str, ...]       # upstream issues / PRs
    paths: tuple[str, ...]            # paths whose behaviour the knobs change
    knobs: Knobs                      # the injection
    trigger: Callable[[], Scenario]   # smallest scenario that shows it
    invariants: tuple[str, ...]       # invariants expected to catch it
    limits: str = ""                  # what of the real bug the model does not capture
    knobs_fn: Callable[[Scenario], Knobs] | None = None  # injection that depends on the scenario

    @property
    def fixed(self) -> Knobs:
        return Knobs()

    def knobs_for(self, s: Scenario) -> Knobs:
        """The injection on scenario ``s`` (``knobs`` unless it derives from the scenario's limits)."""
        return self.knobs_fn(s) if self.knobs_fn else self.knobs


def registry() -> dict[str, Fault]:
    from cpsim.faults.catalogue import FAULTS
    return {f.name: f for f in FAULTS}


def names() -> list[str]:
    return list(registry())


def get(name: str, field: str = "fault") -> Fault:
    reg = registry()
    if name not in reg:
        raise ConfigError(field, f"unknown fault {name!r}; known faults: {', '.join(reg)}")
    return reg[name]

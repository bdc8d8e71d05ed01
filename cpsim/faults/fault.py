"""One catalogue fault: the knobs that inject it, the scenario that shows it, what should catch it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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

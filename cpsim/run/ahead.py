"""Rank runs started before they are asked for (``KernelRunner.ahead``), and their results kept.

Fuzz checks one scenario and draws the next while the workers run the one in between: up to
``DEPTH`` scenarios are in flight, each queued in the workers behind the one before, so a worker
never waits for the caller between two of them. Any other use of the workers first collects them
(``settle``) and keeps their results for the ``run_paths`` call they were started for (``take``).
"""

from __future__ import annotations

import collections

from cpsim.run.chunks import _Run, finish

DEPTH = 2  # scenarios whose rank runs may be in flight at once: one running, one queued behind it


class RunAhead:
    """One runner's runs started ahead: in flight (oldest first) and collected early."""

    def __init__(self) -> None:
        self.inflight: collections.deque[_Run] = collections.deque()  # started, not collected
        self.kept: list[tuple[_Run, dict]] = []  # collected early (another run needed the workers), not asked for

    def full(self) -> bool:
        return len(self.inflight) >= DEPTH

    def take(self, s, paths, device: str, knobs, kernels) -> dict | None:
        """The results of runs started ahead for this very call, or None; on the way every run started
        before it is collected and kept, so the workers are free for whatever comes next."""
        for i, (run, results) in enumerate(self.kept):
            if run.matches(s, paths, device, knobs, kernels):
                del self.kept[i]
                return results
        while self.inflight:
            run, results = self._collect_oldest()
            if run.matches(s, paths, device, knobs, kernels):
                return results
            self._keep(run, results)
        return None

    def settle(self) -> None:
        """Collect the runs started ahead before the workers are used for anything else."""
        while self.inflight:
            self._keep(*self._collect_oldest())

    def forget(self) -> None:
        """Wait for the runs in flight and drop every result nobody asked for (the end of a search)."""
        self.settle()
        self.kept.clear()

    def _collect_oldest(self) -> tuple[_Run, dict]:
        run = self.inflight[0]
        try:
            return run, finish(run)
        finally:
            self.inflight.popleft()

    def _keep(self, run: _Run, results: dict) -> None:
        self.kept.append((run, results))
        del self.kept[:-DEPTH]  # results nobody asked for in time are dropped

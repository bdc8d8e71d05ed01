"""A fuzz job's end on SIGTERM (the parent's stop, or a kernel that signals its job's parent).

The job's kernel workers end first, whole trees (``cpsim.run.isolation.end_workers``),
then the job leaves with 128 + SIGTERM. Left running while the job unwinds, a worker in the middle
of a reply finds its socket closed and prints that as a ``BrokenPipeError`` traceback, though the
parent has already written the summary.
"""

from __future__ import annotations

import signal
import sys


def end_job(signum: int, frame) -> None:
    """SIGTERM handler of a fuzz job process. A job stopped before it has loaded the isolation (or while
    it is leaving) has no workers to end: the module is then missing or only partly initialised."""
    end_workers = getattr(sys.modules.get("cpsim.run.isolation"), "end_workers", None)
    if end_workers is not None:
        end_workers()
    sys.exit(128 + signal.SIGTERM)

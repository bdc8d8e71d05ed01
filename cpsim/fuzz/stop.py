"""A fuzz job's end on SIGTERM (the parent's stop, or a kernel that signals its job's parent).

The job's kernel workers end first, whole trees (its runner's ``KernelRunner.end``),
then the job leaves with 128 + SIGTERM. Left running while the job unwinds, a worker in the middle
of a reply finds its socket closed and prints that as a ``BrokenPipeError`` traceback, though the
parent has already written the summary.
"""

from __future__ import annotations

import signal
import sys


class JobStop:
    """SIGTERM handler of a fuzz job process, installed before its imports. It ends the job's kernel
    runner once the job has built one (``runner``); a job stopped before that has no workers to end."""

    def __init__(self) -> None:
        self.runner = None

    def __call__(self, signum: int, frame) -> None:
        if self.runner is not None:
            self.runner.end()
        sys.exit(128 + signal.SIGTERM)

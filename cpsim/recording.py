"""Whether a capture is recording this process's kernel launches.

``cpsim.capture`` sets it while a capture runs; ``cpsim.run.runner`` reads it and then runs
the kernels in this process, where the recorder sees their launches (a worker's would go
unrecorded). It sits in the lowest layer so that run need not import capture, which is above it.
"""

from __future__ import annotations

from typing import Any

_recorder: Any = None


def active() -> Any:
    """The running capture's recorder, or None."""
    return _recorder


def set_active(recorder: Any) -> None:
    global _recorder
    _recorder = recorder

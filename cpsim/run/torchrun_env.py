"""What a run is launched with, readable before torch is imported: whether torchrun started this process,
the devices ``--device`` names and the default bound on every init and collective (``--timeout``)."""

from __future__ import annotations

import os

DEVICES = ("auto", "npu", "cuda", "cpu")
DEFAULT_TIMEOUT_S = 300.0


def launched_by_torchrun() -> bool:
    """torchrun (and any env:// launcher) exports RANK and WORLD_SIZE to each worker."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ

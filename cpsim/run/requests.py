"""What the parent asks a kernel worker (``cpsim.run.kernel_worker``): one named dataclass per request.

Requests travel pickled (``multiprocessing.connection``): the parent writes them and the worker,
its child, trusts its parent. Replies go the other way as plain data only (``cpsim.run.wire``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Prepare:
    """Get ready for ``device`` (Triton's interpreter on CPU) with the parent's intra-op ``threads``."""

    device: str
    threads: int | None = None


@dataclass(frozen=True)
class Probe:
    """Import a kernel SPEC and send back its signature (``KernelRunner.probe``)."""

    spec: str
    path: str
    shim_vllm: bool
    device: str
    where: str


@dataclass(frozen=True)
class RunRank:
    """One rank run of ``path`` (``Worker.run``: a single rank, a torchrun rank's user kernel)."""

    path: str
    s: Any
    allocs: Any
    rank: int
    device: str
    knobs: Any
    record: dict | None


@dataclass(frozen=True)
class Call:
    """``fn(kernel, *args)`` with the user's kernel loaded in the worker (``KernelRunner.call``)."""

    fn: Callable
    path: str
    record: dict | None
    device: str
    args: tuple


@dataclass(frozen=True)
class Load:
    """Hold scenario ``s`` and these ranks' allocations under ``token`` for the ``RunRanks`` behind it."""

    token: int
    s: Any
    allocs: dict


@dataclass(frozen=True)
class RunRanks:
    """The listed ranks of one path of the loaded scenario, in order (``cpsim.run.chunks``); ``batch``:
    all their replies in one message."""

    path: str
    token: int
    ranks: list
    device: str
    knobs: list
    record: dict | None
    batch: bool = False

"""Starting a kernel worker's interpreter (``cpsim.run.kernel_worker``): the child process and its
pipe. Imports no torch, so a command can start its workers before it imports torch itself
(``HeadStart``): a worker's start is an interpreter importing torch and cpsim (seconds), and it then
runs on the other core while this process imports the same, instead of after it.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection

from cpsim.errors import ConfigError
from cpsim.run import reaper


# The child's first line: cpsim is imported from where this process imported it, never from the
# current directory (``-c`` would put it first on sys.path, and a ``cpsim/`` folder there shadows
# the package: issue 30, item 1).
_BOOT = ("import sys; sys.path[0] = sys.argv[1]; "
         "from cpsim.run.kernel_worker import main; main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])")


_CPSIM_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when ``pid`` ends (Linux 5.3+), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


@dataclass
class Child:
    """A worker's interpreter, started and not yet asked to prepare (``Worker.adopt``)."""

    proc: subprocess.Popen
    conn: Connection      # this process's end of the child's socket
    pidfd: int | None     # readable once the child has ended


def start_child(marker: reaper.Marker) -> Child:
    """A fresh interpreter running ``kernel_worker.main`` in a session and process group of its own, its
    environment carrying ``marker``; it imports cpsim from the directory this process imported it from."""
    here, there = socket.socketpair()
    authkey = multiprocessing.current_process().authkey.hex()  # torch's shared tensors travel under it
    proc = subprocess.Popen(
        [sys.executable, "-c", _BOOT, _CPSIM_ROOT, str(there.fileno()), str(os.getpid()), authkey],
        pass_fds=(there.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True, env=marker.worker_env())
    pidfd = _pidfd(proc.pid)
    there.close()
    return Child(proc, Connection(here.detach()), pidfd)


class HeadStart:
    """Worker interpreters started before this process imports torch, for the ``KernelRunner`` built next to
    adopt (its pool takes their marker too). Each child asks for nothing until the runner sends it a
    device (``Worker.ensure``); a child never adopted ends with this process (``kernel_worker._die_with``)."""

    def __init__(self, count: int) -> None:
        self.marker = reaper.Marker()
        self.children = [start_child(self.marker) for _ in range(count)]


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pool_size(device: str) -> int:
    """Workers per process: two on CPU, sharing the ranks of every path (the interpreter is
    CPU-bound); four on CUDA, two per default path, each with half of its path's ranks (``_shares``:
    there the host's work around the microsecond kernels is the cost, and four processes do it side
    by side; measured on an H200, docs/BENCHMARKS.md, seventh round); one on an NPU, where several
    contexts on one device were never measured. ``CPSIM_KERNEL_WORKERS`` overrides; fuzz jobs divide
    the cores between them."""
    env = os.environ.get("CPSIM_KERNEL_WORKERS")
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError("CPSIM_KERNEL_WORKERS", f"must be a positive integer, got {env!r}")
        return n
    kind = str(device).split(":")[0]
    if kind == "cuda":
        return 4
    if kind != "cpu":
        return 1
    return max(1, min(2, usable_cores()))

"""Starting a kernel worker's interpreter (``cpsim.run.kernel_worker``): the child process and its
pipe. Imports no torch, so a command can start its workers before it imports torch itself.
"""

from __future__ import annotations

import os

from cpsim.errors import ConfigError


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

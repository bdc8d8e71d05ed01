"""Starting a kernel worker's interpreter (``cpsim.run.kernel_worker``): the child process and its
pipe. Imports no torch, so a command can start its workers before it imports torch itself.
"""

from __future__ import annotations

import os


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

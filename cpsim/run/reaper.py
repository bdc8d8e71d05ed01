"""Ending what a kernel started: processes it forked, wherever they went (Linux; /proc)."""

from __future__ import annotations

import os
import signal

_SUBREAPER: list[bool] = []  # set once this process is its descendants' subreaper (``become_subreaper``)
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def become_subreaper() -> bool:
    """Make this process (cpsim's command) the subreaper of everything it starts (Linux).

    A worker and whatever the kernel forks share the worker's process group, which ``stop`` and exit
    end; a kernel's child that calls ``setsid()`` leaves that group, and once its parent is gone it
    would be re-parented to init and outlive cpsim. As a subreaper this process inherits such
    orphans instead, so ``end_descendants`` still finds them among its descendants and ends them.
    Not done by the library on its own (the pytest plugin's process is the user's): only the CLI asks.
    """
    if _SUBREAPER or not os.path.isdir("/proc"):
        return bool(_SUBREAPER)
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            _SUBREAPER.append(True)
    except (OSError, AttributeError):  # no prctl here: the process groups remain the bound
        pass
    return bool(_SUBREAPER)


def _descendants(root: int) -> list[tuple[int, bool]]:
    """(pid, zombie) of every live descendant of ``root``, read from /proc/*/stat (parent links)."""
    kids: dict[int, list[tuple[int, bool]]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        kids.setdefault(int(fields[1]), []).append((int(d), fields[0] == "Z"))
    out, todo = [], list(kids.get(root, []))
    while todo:
        pid, zombie = todo.pop()
        out.append((pid, zombie))
        todo += kids.get(pid, [])
    return out


def end_descendants(bound_s: float = 3.0) -> None:
    """SIGKILL every descendant of this process and reap the ones that are its children, in rounds
    (a killed process's orphans come back to this subreaper), until none is left or ``bound_s``."""
    import time
    end = time.monotonic() + bound_s
    me = os.getpid()
    while True:
        found = _descendants(me)
        for pid, zombie in found:
            if not zombie:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for pid, _ in found:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not our child (yet): reaped by its own parent or in a later round
                pass
        if not found or time.monotonic() > end:
            return
        time.sleep(0.02)


def is_subreaper() -> bool:
    return bool(_SUBREAPER)

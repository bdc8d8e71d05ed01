"""Ending what a kernel started: every process it forked, wherever it went (Linux; /proc).

A kernel may fork, and its child may call ``setsid()`` to leave the worker's process group, so
ending the group is not enough. Three layers, each for the escape the one before leaves open:

1. *The worker is a subreaper* (``become_subreaper``, in ``kernel_worker.main``): a kernel's
   orphaned child (a double-forked daemon) is re-parented to the worker, not to init, so while the
   worker lives everything the kernel started stays below it.
2. *Trees are ended whole* (``end_trees``): every process found below the roots is SIGSTOPped
   (a stopped process cannot fork), the children are read again until no new one appears, then
   all are SIGKILLed. The worker ends its own subtree before it exits; the parent ends a worker's
   tree when it stops it (timeout, crash, shutdown, exit), so a setsid() grandchild no longer
   survives a SIGKILLed worker.
3. *A sweep by marker* (``Marker.sweep``): a worker killed before layer 2 ran (the kernel SIGKILLs its
   own worker after a setsid fork) orphans its subtree to init (unless the parent is a subreaper,
   as the CLI is), out of the parent's reach by ancestry. Every worker's environment holds
   ``CPSIM_WORKER_SESSION=<token of the pool that started it>`` (its ``Marker``), which what it starts
   inherits; the sweep ends every process of this uid whose environment holds the token. The pytest
   plugin sweeps after each check and at the session's end, the CLI at the end of each command; every
   runner when it ends (``cpsim.run.runner``).

What can still escape: a process that replaced its environment (``execve`` with a cleared or
rewritten one; /proc/PID/environ is the environment a process was exec'd with) after every marked
ancestor of it died, or one that made itself unreadable (``prctl(PR_SET_DUMPABLE, 0)``, a setuid
program): nothing is left that ties it to cpsim. Under the ``cpsim`` command even those stay its
descendants (the CLI is a subreaper too) and end at exit; under the pytest plugin, whose process is
the user's and is never made a subreaper, they can outlive the run. Without /proc (not Linux) only
the workers and their process groups are ended.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from typing import Iterable

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PR_GET_CHILD_SUBREAPER = 37
PR_SET_PDEATHSIG = 1
SESSION_VAR = "CPSIM_WORKER_SESSION"


def become_subreaper() -> bool:
    """Make this process the subreaper of everything it starts (Linux): orphans below it are
    re-parented to it, not to init, so ``end_descendants`` / ``end_trees`` still find them.

    The CLI and every kernel worker ask; the library does not on its own (the pytest plugin's process
    is the user's, and a subreaper must reap what it inherits). Elsewhere (no prctl) a no-op: the
    process groups and the marker sweep remain the bound.
    """
    if is_subreaper() or not os.path.isdir("/proc"):
        return is_subreaper()
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here
        pass
    return is_subreaper()


def end_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask for ``signum`` when this process's parent dies (Linux ``PR_SET_PDEATHSIG``): a torchrun
    rank whose agent was killed (by a kernel, say) ends as one stopped by torchrun, so rank 0 still
    writes its report and no rank outlives its job, failing later on the agent's store. A parent
    already gone by now is not seen (the rank then ends on its collectives' bound)."""
    if not os.path.isdir("/proc"):
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here
        pass


def is_subreaper() -> bool:
    """Whether this process is its descendants' subreaper, as the kernel says (not inherited by a child)."""
    if not os.path.isdir("/proc"):
        return False
    try:
        import ctypes
        flag = ctypes.c_int(0)
        if ctypes.CDLL(None, use_errno=True).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):  # no prctl here
        return False
    return bool(flag.value)


class Marker:
    """The worker marker of one pool of workers: ``CPSIM_WORKER_SESSION=<token>`` in the environment of
    every worker it starts, inherited by what they start, so ``sweep`` finds what a dead worker left.
    The token is drawn per process: a copy of the marker in a forked child draws one of its own."""

    def __init__(self) -> None:
        self._pid = -1
        self._token = ""

    def token(self) -> str:
        if self._pid != os.getpid():
            self._pid, self._token = os.getpid(), secrets.token_hex(8)
        return self._token

    def worker_env(self) -> dict[str, str]:
        """The environment a kernel worker starts with: this one plus the marker."""
        return dict(os.environ, **{SESSION_VAR: self.token()})

    def sweep(self, spare: Iterable[int] = ()) -> list[int]:
        """End every process of this uid whose environment holds this marker, with whatever is
        below it, except the processes in ``spare`` (live workers and their subtrees); returns the
        marked pids found. The last resort for processes whose worker died before it could end them."""
        return sweep(self.token(), spare)


def _children(pid: int) -> set[int]:
    """The children of ``pid``, from /proc/PID/task/*/children (a thread's children are listed
    under that thread)."""
    out: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out.update(int(x) for x in f.read().split())
        except OSError:
            continue
    return out


def _state(pid: int) -> str:
    """The one-letter state of ``pid`` ("R", "S", "T", "Z", ...); "" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def tree(roots: Iterable[int]) -> set[int]:
    """``roots`` and every process below them, as /proc shows them now (nothing is stopped)."""
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += _children(pid)
    return found


def end_trees(roots: Iterable[int], include_roots: bool = True, bound_s: float = 2.0) -> list[int]:
    """SIGKILL every process below ``roots`` (and the roots, unless ``include_roots`` is False: a
    process ending its own subtree); returns the pids killed.

    Each process found is SIGSTOPped first and waited for until it is stopped, so none can fork
    while the tree is read; the children are read again until a round finds no new process (a
    process that exited meanwhile re-parented its children to a subreaper or init: those already
    seen are stopped, and a subreaper root is read again each round). On return the processes are
    dead (zombies at most). Bounded by ``bound_s`` twice (stopping, dying): a process that will not
    stop (uninterruptible sleep) is killed as it is.
    """
    roots = list(roots)
    if not os.path.isdir("/proc"):
        return [p for p in roots if include_roots and _signal(p, signal.SIGKILL)]
    end = time.monotonic() + bound_s
    seen: list[int] = []
    todo = list(roots) if include_roots else sorted(set().union(*map(_children, roots)))
    while todo:
        for pid in todo:
            _signal(pid, signal.SIGSTOP)
        seen += todo
        _until(todo, ("", "T", "t", "Z", "X"), end)
        known = set(seen) | set(roots)
        todo = sorted({c for p in known for c in _children(p)} - known)
        if time.monotonic() > end:
            break
    killed = [pid for pid in seen + todo if _signal(pid, signal.SIGKILL)]
    _until(killed, ("", "Z", "X"), time.monotonic() + bound_s)  # SIGKILL lands asynchronously
    return killed


def _until(pids: list[int], states: tuple[str, ...], end: float) -> None:
    """Wait (until ``end``) for each of ``pids`` to be in one of ``states`` ("": gone)."""
    for pid in pids:
        while _state(pid) not in states and time.monotonic() < end:
            time.sleep(0.001)


def reap_children(bound_s: float = 1.0) -> None:
    """Reap every child of this process that has ended or ends within ``bound_s`` (zombies that
    a subreaper inherited included); for a process about to exit, whose children no one else waits for."""
    end = time.monotonic() + bound_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no child left
            return
        if pid == 0:
            if time.monotonic() > end:
                return
            time.sleep(0.005)


def end_descendants(bound_s: float = 3.0) -> None:
    """End every process below this one and reap its children (at exit, as a subreaper: whatever
    the workers left is re-parented here)."""
    end_trees([os.getpid()], include_roots=False, bound_s=bound_s)
    reap_children()


def sweep(token: str, spare: Iterable[int] = ()) -> list[int]:
    """``Marker.sweep`` for the marker ``token``."""
    if not os.path.isdir("/proc"):
        return []
    entry = f"{SESSION_VAR}={token}".encode()
    spare = set(spare) | {os.getpid()}
    uid = os.getuid()
    marked = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in spare:
            continue
        try:
            if os.stat(f"/proc/{d}").st_uid != uid:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone meanwhile, or not readable
            continue
        if entry in env.split(b"\0"):
            marked.append(int(d))
    if marked:
        end_trees(marked)
    return marked

"""The parent's handle on one kernel worker process, and the pool of them a ``KernelRunner`` holds.

A worker is a fresh interpreter running ``cpsim.run.kernel_worker``; its replies are plain data
(``cpsim.run.wire``), read here and turned into outputs or named failures.
"""

from __future__ import annotations

import itertools
import math
import os
import select
import signal

import numpy as np
import torch

from cpsim.errors import ConfigError, DistError
from cpsim.paths import Knobs, RankOutput
from cpsim.run import reaper, requests, wire
from cpsim.run.boot import Child, HeadStart, start_child
from cpsim.run.outcome import KernelFailed, _exit_text, _fail, failed


STARTUP_S = 120.0  # bound for starting the worker and importing Triton there (not the kernel's time)


def _python() -> str:
    import sys
    return sys.executable


def _end_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Worker:
    """One child process running rank runs; restarted after it dies or is killed.

    The child is a fresh interpreter (``kernel_worker.main``) in a session and process group of its
    own: it imports cpsim from the directory this process imported it from (never the current
    directory, which may hold another ``cpsim/`` folder), needs no ``__main__`` guard in the user's
    script (nothing of ``__main__`` is imported there), and ``stop`` ends its whole tree and group,
    so a process the kernel forked does not outlive cpsim, even one in a session of its own (the
    child is the subreaper of its subtree; ``cpsim.run.reaper``). A terminal's Ctrl-C reaches this
    process only.
    """

    def __init__(self, groups: set[int] | None = None, marker: reaper.Marker | None = None) -> None:
        self.groups = set() if groups is None else groups  # its pool's live process groups (``WorkerPool.end``)
        self.marker = reaper.Marker() if marker is None else marker  # its pool's (``reaper.Marker``)
        self.proc = None
        self.conn = None
        self.pidfd: int | None = None  # readable once the child has ended (``_readable``)
        self.device: str | None = None
        self.loaded: int | None = None  # the scenario the child holds (``run_paths`` sends it once per scenario)
        self.generation = 0             # children started so far: a run sent to an earlier one must be sent again
        self.starting = False           # asked to prepare, its answer not read yet (``ready``)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self, device: str) -> None:
        """Start the child and ask it to prepare; ``ready`` waits for the answer (so that
        several workers start at once)."""
        self.adopt(start_child(self.marker))
        self.prepare(device)

    def adopt(self, child: Child) -> None:
        """Take ``child`` (just started, here or ahead of the runner: ``HeadStart``) as this worker's."""
        self.proc, self.conn, self.pidfd = child.proc, child.conn, child.pidfd
        self.groups.add(self.proc.pid)
        self.device = None
        self.loaded = None
        self.starting = False
        self.generation += 1

    def prepare(self, device: str) -> None:
        """Ask the child to get ready for ``device``; ``ready`` reads its answer."""
        self.device, self.starting = device, True
        try:
            self.conn.send(requests.Prepare(device, torch.get_num_threads()))
        except OSError:
            pass

    def ready(self) -> None:
        reply = self._recv(STARTUP_S)
        if isinstance(reply, wire.Ready):
            self.starting = False
            return
        code = self.proc.poll() if self.proc is not None else None
        self.stop()
        if isinstance(reply, wire.Refused):
            raise ConfigError(reply.field, reply.rule)
        if isinstance(reply, wire.Dead):
            why = (f"exited with code {code}" if code is None or code >= 0 else f"was killed ({_exit_text(code)[1]})")
            raise DistError(f"the kernel worker process {why} while it started, before any kernel ran (its "
                            f"error is printed above); check that `{_python()} -c 'import cpsim.run.kernel_worker'` "
                            f"works, or set CPSIM_KERNEL_ISOLATION=0 to run kernels in-process")
        if isinstance(reply, wire.Timeout):
            raise DistError(f"the kernel worker process did not start within {STARTUP_S:g} s; the machine "
                            f"may be overloaded; set CPSIM_KERNEL_ISOLATION=0 to run kernels in-process")
        raise DistError(f"the kernel worker process answered its start with {reply}; set "
                        f"CPSIM_KERNEL_ISOLATION=0 to run kernels in-process")

    def start(self, device: str) -> None:
        self.spawn(device)
        self.ready()

    def ensure(self, device: str) -> bool:
        """Spawn a fresh child unless a live one for ``device`` is there; True when the caller must wait
        for it (``ready``): spawned, or started ahead and only now asked to prepare, or not answered yet."""
        if self.alive() and self.device is None:  # started ahead (``HeadStart``): told its device now
            self.prepare(device)
            return True
        if self.alive() and self.device == device:
            return self.starting
        self.stop()
        self.spawn(device)
        return True

    def stop(self) -> None:
        if self.proc is not None:
            reaper.end_trees([self.proc.pid])  # the child and whatever it forked, in any session
            _end_group(self.proc.pid)
            self.groups.discard(self.proc.pid)
            try:
                self.proc.wait(5)
            except Exception:  # noqa: BLE001  (a child that will not die is left to the kernel; not waited for)
                pass
        if self.conn is not None:
            self.conn.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        self.proc = self.conn = self.pidfd = None
        self.starting = False

    def _read(self, timeout: float = STARTUP_S):
        """The next reply, known to be there or the child ended (``_readable``), as a ``wire``
        message; ``Dead`` when the child is gone before a whole reply came (a process the kernel
        forked may hold the pipe open: the child's end is watched too), ``Timeout`` when a reply
        begun is not whole within ``timeout``, ``Garbled`` when what came is no well-formed reply."""
        try:
            frame = wire.read_frame(self.conn.fileno(), timeout, lambda: not self.alive(), self.pidfd)
            return wire.decode(frame)
        except TimeoutError:  # before OSError, of which it is a kind
            return wire.Timeout()
        except (EOFError, OSError):
            return wire.Dead()
        except wire.Malformed as e:
            return wire.Garbled(str(e))

    def _recv(self, timeout: float):
        """The next reply; ``Timeout`` when the child did not answer in time, ``Dead`` when it died."""
        import time
        deadline = time.monotonic() + timeout
        try:
            if not _readable([self], timeout):
                return wire.Timeout()
        except OSError:
            return wire.Dead()
        return self._read(max(0.0, deadline - time.monotonic()))

    def _ask(self, msg, timeout: float):
        try:
            self.conn.send(msg)
        except (EOFError, OSError):
            return wire.Dead()
        return self._recv(timeout)

    def lost(self, reply, path: str, rank: int, kernel, timeout: float) -> KernelFailed:
        """The failure for a child that timed out or died on ``rank``, or lost a batched chunk (a fault
        surfaced when its outputs were read back); the child is gone after it."""
        if isinstance(reply, wire.LostOnReadback):
            self.stop()
            return _fail("raised", f"raised {reply.name}" + (f": {reply.text}" if reply.text else "")
                         + " when the outputs were read back", path, rank, kernel)
        if isinstance(reply, wire.Garbled):
            self.stop()
            return _fail("garbled", f"process sent a reply that is not well-formed plain data ({reply.why}; "
                                    f"worker killed, nothing of it was unpickled)", path, rank, kernel)
        if isinstance(reply, wire.Timeout):
            self.stop()
            return _fail("timeout", f"exceeded {timeout:g} s (worker killed)", path, rank, kernel)
        try:
            code = self.proc.wait(5)
        except Exception:  # noqa: BLE001  (the pipe closed, the process still there: killed below)
            code = None
        self.stop()
        kind, text = _exit_text(code)
        return _fail(kind, text, path, rank, kernel)

    def run(self, path: str, s, allocs, rank: int, device: str, knobs: Knobs, kernel, timeout: float
            ) -> RankOutput | None:
        if self.ensure(device):
            self.ready()
        reply = self._ask(requests.RunRank(path, s, allocs, rank, device, knobs, _record(kernel)), timeout)
        if isinstance(reply, LOST):
            raise self.lost(reply, path, rank, kernel, timeout)
        return self.answer(reply, path, rank, kernel)

    def answer(self, reply, path: str, rank: int, kernel):
        """A rank run's output from the child's reply, or the failure it names. A reply that is not
        one a rank run answers with, or that answers for another path or rank, is the kernel's
        doing (it owns the child's socket): a failure on this rank, and the child is stopped."""
        from cpsim.run.kernel_worker import unpack
        if isinstance(reply, wire.RankDone):
            if (reply.path, reply.rank) != (path, rank):
                raise self.lost(wire.Garbled(f"it answered for path {reply.path[:40]!r} rank {reply.rank}"),
                                path, rank, kernel, 0)
            for note in reply.notes:
                kernel.note(note)
            return unpack(reply.output)
        if isinstance(reply, wire.Value):  # a ``call``'s result
            for note in reply.notes:
                kernel.note(note)
            arrays = tuple(np.array(a) for a in reply.arrays)
            return arrays if reply.many else arrays[0]
        if isinstance(reply, wire.Refused):
            raise ConfigError(reply.field, reply.rule)
        if isinstance(reply, (wire.Raised, wire.Exited, wire.Unloaded)):  # Unloaded: its import raised or exited
            raise failed(reply, path, rank, kernel)  # in this child (the probe's child had it load)
        raise self.lost(reply if isinstance(reply, wire.Garbled) else
                        wire.Garbled(f"a {type(reply).__name__} where a rank run's reply was due"),
                        path, rank, kernel, 0)


LOST = (wire.Timeout, wire.Dead, wire.Garbled)  # the child did not answer, or answered with no well-formed reply


def _record(kernel) -> dict | None:
    return None if kernel is None else kernel.record()


def _readable(workers: list, timeout: float) -> list:
    """The workers with a message (or an end) to read or whose child has ended, waiting at most
    ``timeout`` seconds: ``multiprocessing.connection.wait`` without its selector set up and torn
    down on every call. The child's end is watched through its pidfd as well as its pipe, which a
    process the kernel forked may hold open after the child died (without pidfds: the pipe only)."""
    if not hasattr(select, "poll"):
        from multiprocessing.connection import wait
        got = wait([w.conn for w in workers], timeout)
        return [w for w in workers if w.conn in got]
    poller = select.poll()
    by_fd = {}
    for w in workers:
        for fd in (w.conn.fileno(), w.pidfd):
            if fd is not None:
                by_fd[fd] = w
                poller.register(fd, select.POLLIN)
    return list(dict.fromkeys(by_fd[fd] for fd, _ in poller.poll(math.ceil(timeout * 1000))))


class WorkerPool:
    """A runner's kernel workers and the process groups they lead. The first worker also answers
    probes, calls and single rank runs; ``run_paths`` grows the pool to its size (``pool_size``)."""

    def __init__(self, head_start: HeadStart | None = None) -> None:
        self.groups: set[int] = set()  # process groups of live workers: ended by ``end``
        # in every worker's environment: what they leave is swept by it
        self.marker = reaper.Marker() if head_start is None else head_start.marker
        self.workers: list[Worker] = [Worker(self.groups, self.marker)]
        self.tokens = itertools.count()  # one per run: names the scenario a worker holds
        children = [] if head_start is None else head_start.children
        self.grow(len(children))
        for w, child in zip(self.workers, children):
            w.adopt(child)

    def __len__(self) -> int:
        return len(self.workers)

    def __getitem__(self, i):
        return self.workers[i]

    def __iter__(self):
        return iter(self.workers)

    @property
    def first(self) -> Worker:
        return self.workers[0]

    def grow(self, size: int) -> None:
        while len(self.workers) < size:
            self.workers.append(Worker(self.groups, self.marker))

    def tell(self, device: str) -> None:
        """Tell the live workers started ahead (``HeadStart``) and not told their device yet that it is
        ``device``, waiting for none: each prepares (imports Triton) meanwhile; ``ensure`` reads its answer."""
        for w in self.workers:
            if w.alive() and w.device is None:
                w.prepare(device)

    def end(self) -> None:
        """Whatever the workers and the kernels they ran left behind ends with cpsim: each worker's
        tree and process group, every process still carrying the pool's worker marker
        (``cpsim.run.reaper``), and, as a subreaper (the CLI), every process still descending from this
        one, wherever its session."""
        reaper.end_trees(list(self.groups))
        for pgid in list(self.groups):
            _end_group(pgid)
        self.groups.clear()
        self.marker.sweep()
        if reaper.is_subreaper():
            reaper.end_descendants()

    def sweep_escaped(self) -> list[int]:
        """End the processes a dead worker's kernel left (found by the worker marker), sparing the live
        workers and what is below them (their kernels' children end when the worker is stopped); the
        marked pids found. Run when a check is over: nothing of a kernel is meant to run then."""
        live = [w.proc.pid for w in self.workers if w.alive()]
        return self.marker.sweep(spare=reaper.tree(live))

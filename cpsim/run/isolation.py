"""Kernels run in a child process, bounded in time, so that nothing they do can end the run well.

The kernel under test is hostile input: it may raise, crash the interpreter
(an out-of-bounds store under the Triton interpreter is a SIGSEGV), never return,
or call ``sys.exit(0)`` / ``os._exit(0)``. In cpsim's own process any of these
would lose the report, hang the run or - worst - end it with exit code 0. So
every rank run of a path (``cpsim.paths.run_path``) goes to a persistent worker
process and comes back as a ``RankOutput`` or as a ``KernelFailure`` the
coordinator reports (invariant ``kernel-completes``, exit 1).

Why a persistent forkserver worker: ``fork`` from a process that has started
torch's thread pools may deadlock in the child, and a fresh ``spawn`` per rank
run costs a torch import each time (seconds on a busy CPU). The forkserver starts
clean, preloads torch and cpsim once, and forks the worker from that warm state;
the worker stays up for the whole command (fuzz reuses it across scenarios) and
is only replaced after a crash or a timeout. The virtual world (``run_paths``) cuts each
path's ranks into one contiguous chunk per worker, one message per chunk, all sent at once
behind the scenario itself (sent once); on CPU it keeps two workers, so both cores run kernels
(``CPSIM_KERNEL_WORKERS``). ``ahead`` starts a scenario's rank runs before they are asked for,
up to two scenarios queued at once: fuzz checks one scenario and draws the next while the worker
runs the one in between, so neither side waits for the other. A chunk of cpsim's own kernels is
answered in one message; should the child be lost before it answers, the chunk's ranks run again
in a fresh child, one reply each, which pins the crash or hang on its rank (a loss that does not
recur is still reported, on the chunk). A user's kernel is always answered rank by rank.
Triton is imported inside the worker after ``TRITON_INTERPRET=1`` is set
(``cpsim.paths._inputs.prepare_triton``).
Cost: docs/BENCHMARKS.md.

Under torchrun (``run_rank_checked``) only the user's kernels go to a worker: the
rank is already a process of its own with bounded collectives.

``CPSIM_KERNEL_ISOLATION=0`` runs kernels in-process (exceptions and ``sys.exit``
still become failures; crashes and hangs are not caught) - for debugging only.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import math
import multiprocessing
import os
import select
import signal
import struct
from dataclasses import dataclass, field, replace
from multiprocessing.reduction import ForkingPickler
from typing import Callable

import numpy as np
import torch

from cpsim import recording
from cpsim.errors import ConfigError, DistError
from cpsim.paths import KernelFailure, Knobs, RankOutput, first_failure, prep, run_path
from cpsim.run import reaper, wire

DEFAULT_TIMEOUT_S = 300.0
STARTUP_S = 120.0  # bound for starting the worker and importing Triton there (not the kernel's time)


@dataclass(frozen=True)
class Isolation:
    process: bool = True                # run kernels in the worker process
    timeout_s: float = DEFAULT_TIMEOUT_S  # wall-clock bound of one rank run of one path


_config = Isolation(process=os.environ.get("CPSIM_KERNEL_ISOLATION", "1") != "0")


def configure(timeout_s: float | None = None, process: bool | None = None) -> Isolation:
    global _config
    if timeout_s is not None:
        if not timeout_s > 0 or timeout_s == float("inf"):
            raise ConfigError("--kernel-timeout", f"must be a finite number of seconds > 0, got {timeout_s:g}")
        _config = replace(_config, timeout_s=float(timeout_s))
    if process is not None:
        _config = replace(_config, process=process)
    return _config


TORCHRUN_SHARE = 0.75  # of --timeout: the default kernel bound under torchrun


def configure_from_args(args) -> Isolation:
    """``--kernel-timeout``, else ``--timeout``, else the default bound.

    Under torchrun the default is ``TORCHRUN_SHARE`` of ``--timeout``: the peers wait at most
    ``--timeout`` in the gather that follows the kernel, so a hanging kernel must be stopped
    (and its failure gathered into the report) before they give up on the rank.
    """
    t = getattr(args, "kernel_timeout", None)
    if t is None:
        t = getattr(args, "timeout", None)
        if t is not None and t > 0 and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            t = t * TORCHRUN_SHARE
    return configure(t)


def current() -> Isolation:
    return _config


# The child's first line: cpsim is imported from where this process imported it, never from the
# current directory (``-c`` would put it first on sys.path, and a ``cpsim/`` folder there shadows
# the package: issue 30, item 1).
_BOOT = ("import sys; sys.path[0] = sys.argv[1]; "
         "from cpsim.run.kernel_worker import main; main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])")
_CPSIM_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_groups: set[int] = set()  # process groups of live workers: ended when cpsim exits


def _python() -> str:
    import sys
    return sys.executable


def _end_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _end_groups() -> None:
    """Whatever the workers and the kernels they ran left behind ends with cpsim: each worker's
    tree and process group, every process still carrying this process's worker marker
    (``cpsim.run.reaper``), and, as a subreaper (the CLI), every process still descending from this
    one, wherever its session."""
    reaper.end_trees(list(_groups))
    for pgid in list(_groups):
        _end_group(pgid)
    _groups.clear()
    reaper.sweep()
    if reaper.is_subreaper():
        reaper.end_descendants()


def sweep_escaped() -> list[int]:
    """End the processes a dead worker's kernel left (found by the worker marker), sparing the live
    workers and what is below them (their kernels' children end when the worker is stopped); the
    marked pids found. Run when a check is over: nothing of a kernel is meant to run then."""
    live = [w.proc.pid for w in _pool if w.alive()]
    return reaper.sweep(spare=reaper.tree(live))


class KernelFailed(DistError):
    """A rank run that did not complete; ``failure`` says how.

    Both worlds turn it into a ``kernel-completes`` violation (under torchrun the
    failure record is gathered in place of the rank's slots, ``cpsim.run.distrun``).
    """

    def __init__(self, failure: KernelFailure):
        self.failure = failure
        super().__init__(failure.message)


def _label(path: str, kernel) -> str:
    return f"{path}: {kernel.spec}" if kernel is not None else f"{path}: built-in kernel"


def _fail(kind: str, text: str, path: str, rank: int, kernel, group: str = "*") -> KernelFailed:
    where = f"on rank {rank}" + (f", group {group}" if group != "*" else "")
    return KernelFailed(KernelFailure(path, rank, kind, f"kernel {text} {where} [{_label(path, kernel)}]", group))


def raised_text(name: str, text: str) -> str:
    """"raised NAME: message at FILE:LINE ..." (no colon before the place when the message is empty)."""
    return f"raised {name}" + ("" if not text else f"{text}" if text.startswith(" at ") else f": {text}")


def _exit_text(code: int | None) -> tuple[str, str]:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return "crashed", f"crashed with {name}"
    return "exited", f"ended its process with exit code {code} (os._exit or a fatal error)"


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

    def __init__(self) -> None:
        self.proc = None
        self.conn = None
        self.pidfd: int | None = None  # readable once the child has ended (``_readable``)
        self.device: str | None = None
        self.loaded: int | None = None  # the scenario the child holds (``run_paths`` sends it once per scenario)
        self.generation = 0             # children started so far: a run sent to an earlier one must be sent again

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self, device: str) -> None:
        """Start the child and ask it to prepare; ``ready`` waits for the answer (so that
        several workers start at once)."""
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection
        here, there = socket.socketpair()
        authkey = multiprocessing.current_process().authkey.hex()  # torch's shared tensors travel under it
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, _CPSIM_ROOT, str(there.fileno()), str(os.getpid()), authkey],
            pass_fds=(there.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True, env=reaper.worker_env())
        _groups.add(self.proc.pid)
        self.pidfd = _pidfd(self.proc.pid)
        there.close()
        self.conn, self.device = Connection(here.detach()), device
        self.loaded = None
        self.generation += 1
        try:
            self.conn.send(("prepare", device, torch.get_num_threads()))
        except OSError:
            pass

    def ready(self) -> None:
        reply = self._recv(STARTUP_S)
        if isinstance(reply, wire.Ready):
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
        """Spawn a fresh child unless a live one for ``device`` is there; True when spawned."""
        if self.alive() and self.device == device:
            return False
        self.stop()
        self.spawn(device)
        return True

    def stop(self) -> None:
        if self.proc is not None:
            reaper.end_trees([self.proc.pid])  # the child and whatever it forked, in any session
            _end_group(self.proc.pid)
            _groups.discard(self.proc.pid)
            try:
                self.proc.wait(5)
            except Exception:  # noqa: BLE001  (a child that will not die is left to the kernel; not waited for)
                pass
        if self.conn is not None:
            self.conn.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        self.proc = self.conn = self.pidfd = None

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
        reply = self._ask(("run", path, s, allocs, rank, device, knobs, _record(kernel)), timeout)
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
        if isinstance(reply, wire.Raised):
            raise _fail("raised", raised_text(reply.name, reply.text), path, rank, kernel, reply.group)
        if isinstance(reply, wire.Exited):
            raise _fail("exited", f"called sys.exit({reply.code})", path, rank, kernel, reply.group)
        if isinstance(reply, wire.Unloaded):  # its import raised or exited in this child (the probe's child had it load)
            raise _fail(reply.kind, reply.message, path, rank, kernel)
        raise self.lost(reply if isinstance(reply, wire.Garbled) else
                        wire.Garbled(f"a {type(reply).__name__} where a rank run's reply was due"),
                        path, rank, kernel, 0)


LOST = (wire.Timeout, wire.Dead, wire.Garbled)  # the child did not answer, or answered with no well-formed reply


def _record(kernel) -> dict | None:
    return None if kernel is None else kernel.record()


def _in_process(path: str, s, allocs, rank: int, device: str, knobs: Knobs, kernel,
                inputs: prep.PerRank | None = None) -> RankOutput | None:
    """The unprotected way (``CPSIM_KERNEL_ISOLATION=0``, a capture): exceptions and sys.exit still
    become failures; the kernel is imported into this process for it. ``inputs``: the run's
    preparation (a stage's, for a path's ranks in turn); else one made for it alone."""
    if kernel is not None:
        failure = _unloaded(path, kernel, rank, s.cp.world)
        if failure is not None:
            raise KernelFailed(failure)
        from cpsim.kernels.under_test import here
        kernel = here(kernel, device)
        failure = _unloaded(path, kernel, rank, s.cp.world)
        if failure is not None:
            raise KernelFailed(failure)
    inputs = inputs if inputs is not None else prep.PerRank(s, device)
    try:
        return run_path(path, s, allocs, rank, device, knobs, kernel, inputs)
    except ConfigError:
        raise
    except SystemExit as e:
        raise _fail("exited", f"called sys.exit({e.code!r})", path, rank, kernel, inputs.launching) from None
    except Exception as e:  # noqa: BLE001  (the kernel's exception becomes a named violation)
        from cpsim.kernels.under_test import where_raised
        text = (str(e).splitlines()[0] if str(e) else "") + where_raised(kernel, e)
        raise _fail("raised", raised_text(type(e).__name__, text), path, rank, kernel,
                    inputs.launching) from None


_worker = Worker()
_pool: list[Worker] = [_worker]


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


def run_paths(s, paths: list[str], allocs: list, device, knobs: list[Knobs], kernels: dict,
              on_rank: Callable[[str, int], None] | None = None) -> dict[str, list | KernelFailure]:
    """Every rank of every path: per path the rank outputs in rank order, or the failure of the
    first rank that did not complete (the later ranks count as not run, as in one process).

    In isolation each path's ranks are cut into one contiguous chunk per worker and each chunk
    goes to its worker in one message; on CPU two workers share every path, so both cores stay
    busy whatever the paths' costs. A worker may have run ranks past the first failing one;
    their outputs are dropped, so the result is the one a single process would give. Rank runs
    ``ahead`` started for this very call are collected instead of being run again."""
    device = str(device)
    world = s.cp.world
    unloaded = {p: f for p in paths if (f := _unloaded(p, kernels.get(p), 0, world)) is not None}
    if unloaded:  # nothing to run of a kernel whose import failed: that is its paths' result
        rest = [p for p in paths if p not in unloaded]
        got = run_paths(s, rest, allocs, device, knobs, kernels, on_rank) if rest else {}
        return {p: unloaded[p] if p in unloaded else got[p] for p in paths}
    if not _config.process or recording.active() is not None:
        return {p: _sequential(p, s, allocs, device, knobs, kernels.get(p), on_rank, range(world)) for p in paths}
    got = _take(s, paths, device, knobs, kernels)
    if got is not None:
        return got
    return _finish(_start(s, paths, allocs, device, knobs, kernels, on_rank))


def _unloaded(path: str, kernel, rank: int, world: int) -> KernelFailure | None:
    """The failure of every run of a kernel whose import raised, exited, hung or crashed."""
    failure = None if kernel is None else kernel.load_failure
    if failure is None:
        return None
    return KernelFailure(path, rank, failure.kind, f"kernel {failure.message} [{_label(path, kernel)}]",
                         "*", [r for r in range(world) if r != rank])


def probe(spec: str, path: str, shim_vllm: bool, device: str, where: str):
    """A kernel's ``Signature``, read by a kernel worker that imports it, within ``--kernel-timeout``;
    a ``LoadFailure`` when the import raised, exited, hung or crashed. This process never imports it
    (the oracle stays out of the kernel's reach: the worker is another process, and what it sends
    back is plain data). In-process where isolation is off."""
    from cpsim.kernels.under_test import LoadFailure, Signature, inspect_here
    if not _config.process:
        from cpsim.kernels.under_test import KernelImportError
        try:
            return inspect_here(spec, path, shim_vllm, device, where)
        except KernelImportError as e:
            return e.failure
    _settle()
    if _worker.ensure(device):
        _worker.ready()
    timeout = _config.timeout_s
    reply = _worker._ask(("probe", spec, path, shim_vllm, device, where), timeout)
    if isinstance(reply, wire.SignatureRead):
        return Signature(reply.name, reply.triton, reply.is_callable, tuple(reply.params), reply.origin,
                         release=reply.release)
    if isinstance(reply, wire.Refused):
        raise ConfigError(reply.field, reply.rule)
    if isinstance(reply, wire.Unloaded):
        return LoadFailure(reply.kind, reply.message)
    what = f"{'file ' + spec.rpartition(':')[0] if ':' in spec else spec}"
    if isinstance(reply, wire.Timeout):
        _worker.stop()
        return LoadFailure("timeout", f"did not finish importing {what} within {timeout:g} s (worker killed)")
    if not isinstance(reply, wire.Dead):
        _worker.stop()
        why = reply.why if isinstance(reply, wire.Garbled) else f"a {type(reply).__name__}"
        return LoadFailure("garbled", f"sent a reply that is not well-formed plain data ({why}) while {what} "
                                      f"was imported (worker killed, nothing of it was unpickled)")
    try:
        code = _worker.proc.wait(5)
    except Exception:  # noqa: BLE001
        code = None
    _worker.stop()
    kind, text = _exit_text(code)
    return LoadFailure(kind, f"{text} while {what} was imported")


def call(fn: Callable, path: str, kernel, *args, rank: int = 0, device: str = "cpu"):
    """``fn(kernel, *args)`` run in a kernel worker that loads the user's ``kernel`` there, within
    ``--kernel-timeout``: for rank runs that are not a scenario's (a capture's or an explicit
    batch's steps rerun, ``cpsim.capture.rerun``). ``fn`` is a module-level function (it travels by
    name) and returns an integer array or a tuple of them, sent back as plain data (``cpsim.run.wire``):
    nothing of the kernel's runs in this process. Raises ``KernelFailed`` naming ``rank`` when the kernel's import
    or the call raised, exited, crashed or hung. In-process where isolation is off."""
    device = str(device)
    failure = _unloaded(path, kernel, rank, 1)
    if failure is not None:
        raise KernelFailed(failure)
    if not _config.process:
        from cpsim.kernels.under_test import here, where_raised
        k = here(kernel, device)
        failure = _unloaded(path, k, rank, 1)
        if failure is not None:
            raise KernelFailed(failure)
        try:
            return fn(k, *args)
        except ConfigError:
            raise
        except SystemExit as e:
            raise _fail("exited", f"called sys.exit({e.code!r})", path, rank, kernel) from None
        except Exception as e:  # noqa: BLE001  (the kernel's exception becomes a named violation)
            text = (str(e).splitlines()[0] if str(e) else "") + where_raised(k, e)
            raise _fail("raised", raised_text(type(e).__name__, text), path, rank, kernel) from None
    _settle()
    if _worker.ensure(device):
        _worker.ready()
    timeout = _config.timeout_s
    reply = _worker._ask(("call", fn, path, _record(kernel), device, args), timeout)
    if isinstance(reply, LOST):
        raise _worker.lost(reply, path, rank, kernel, timeout)
    return _worker.answer(reply, path, rank, kernel)


DEPTH = 2  # scenarios whose rank runs may be in flight at once: one running, one queued behind it


def ahead(s, paths: list[str], allocs: list, device, knobs: list[Knobs], kernels: dict) -> bool:
    """Start the rank runs of a ``run_paths`` call the caller will make later, and return at once, so
    the workers run them while the caller works on something else (fuzz checks one scenario and
    draws the next meanwhile). Up to ``DEPTH`` scenarios are in flight, each queued in the workers
    behind the one before, so a worker never waits for the caller between two of them. Any other
    use of the workers first waits for them and keeps their results. False (nothing started)
    in-process, under a capture, or with ``DEPTH`` scenarios already in flight."""
    if not _config.process or recording.active() is not None or len(_inflight) >= DEPTH:
        return False
    if any(_unloaded(p, kernels.get(p), 0, 1) is not None for p in paths):
        return False
    _inflight.append(_start(s, paths, allocs, str(device), knobs, kernels, None))
    return True


_inflight: "collections.deque[_Run]" = collections.deque()  # started by ``ahead``, oldest first, not collected
_kept: "list[tuple[_Run, dict]]" = []  # collected early (another run needed the workers), not asked for yet


def _take(s, paths, device: str, knobs, kernels) -> dict | None:
    """The results of runs started ahead for this very call, or None; on the way every run started
    before it is collected and kept, so the workers are free for whatever comes next."""
    for i, (run, results) in enumerate(_kept):
        if run.matches(s, paths, device, knobs, kernels):
            del _kept[i]
            return results
    while _inflight:
        run, results = _collect_oldest()
        if run.matches(s, paths, device, knobs, kernels):
            return results
        _keep(run, results)
    return None


def _settle() -> None:
    """Collect the runs started ahead before the workers are used for anything else."""
    while _inflight:
        _keep(*_collect_oldest())


def _collect_oldest() -> "tuple[_Run, dict]":
    run = _inflight[0]
    try:
        return run, _finish(run)
    finally:
        _inflight.popleft()


def _keep(run: "_Run", results: dict) -> None:
    _kept.append((run, results))
    del _kept[:-DEPTH]  # results nobody asked for in time are dropped


def forget_ahead() -> None:
    """Wait for the runs in flight and drop every result nobody asked for (the end of a search)."""
    _settle()
    _kept.clear()


@dataclass
class _Run:
    """One ``run_paths`` call's rank runs: what was sent to which worker, and what came back."""

    s: object
    paths: list
    allocs: list
    device: str
    knobs: list
    kernels: dict
    on_rank: Callable[[str, int], None] | None
    token: int
    workers: list
    outs: dict
    fails: dict
    queues: dict     # worker -> [[path, ranks not yet answered, batched], ...], in the order sent
    deadline: dict   # worker -> when its next reply is due
    sent_to: dict = field(default_factory=dict)  # worker -> its generation the queue was sent to (None: unsent)
    retried: dict = field(default_factory=dict)  # path -> (failure, ranks): a batched chunk lost, run again
    loads: dict = field(default_factory=dict)    # ranks -> the pickled "load" message for them

    def matches(self, s, paths, device, knobs, kernels) -> bool:
        return (self.s is s and self.paths == list(paths) and self.device == str(device)
                and self.knobs == list(knobs) and self.kernels.keys() == kernels.keys()
                and all(self.kernels[p] is kernels[p] for p in kernels))


def _start(s, paths, allocs, device: str, knobs, kernels, on_rank) -> _Run:
    world = s.cp.world
    size = pool_size(device)
    if device.split(":")[0] != "cpu" and size < 2 * len(paths):  # whole paths per worker (``_shares``)
        size = min(size, max(1, len(paths)))
    while len(_pool) < size:
        _pool.append(Worker())
    # With runs in flight a worker's replies to them are still due: it is neither restarted nor
    # waited for here; a dead one gets this run's chunks when the run is collected (``_finish``).
    busy = bool(_inflight)
    if not busy:
        spawned = [w for w in _pool[:size] if w.ensure(device)]
        for w in spawned:
            w.ready()
    token = next(_tokens)
    shares = _shares(list(paths), world, size, device)
    # Each run starts at another worker, so that runs queued one behind the other with fewer shares
    # than workers (CP 1, say) still go to different workers.
    workers = [_pool[(token + k) % size] for k in range(len(shares))]
    run = _Run(s, list(paths), allocs, device, list(knobs), kernels, on_rank, token, workers,
               {p: {} for p in paths}, {p: [] for p in paths}, {w: [] for w in workers}, {})
    try:
        for w, tasks in zip(workers, shares):
            if busy and not (w.alive() and w.device == device):
                run.queues[w].extend([p, list(r), _batched(kernels.get(p))] for p, r in tasks)
                run.sent_to[w] = None
            else:
                _send(run, w, tasks)
    except BaseException:
        _stop_busy(run)
        raise
    return run


def _shares(paths: list[str], world: int, size: int, device: str) -> list[list[tuple[str, list[int]]]]:
    """What each of up to ``size`` workers runs of one scenario: [(path, ranks)] per worker.

    On CPU a rank run's cost is its kernels in the interpreter, so the ranks are cut into one
    contiguous chunk per worker, every path's alike. On an accelerator a rank run costs little
    beside what its path prepares once for all of its ranks (tables, uploads: ``cpsim.paths.prep``),
    so each worker takes whole paths: cutting the ranks repeats that preparation in every worker.
    Only with at least two workers per path are a path's ranks cut between its workers."""
    if str(device).split(":")[0] == "cpu":
        return [[(p, c) for p in paths] for c in _cut(world, size)]
    if size >= 2 * len(paths):  # workers to spare: each path's ranks cut between several of them
        return [[(p, c)] for p in paths for c in _cut(world, size // len(paths))]
    n = max(1, min(size, len(paths)))
    return [[(p, list(range(world))) for p in paths[k::n]] for k in range(n)]


def _cut(world: int, n: int) -> list[list[int]]:
    """The ranks ``0 .. world-1`` in at most ``n`` contiguous chunks of nearly one size, none empty."""
    n = max(1, min(n, world))
    per = -(-world // n)
    return [c for c in (list(range(k * per, min(world, (k + 1) * per))) for k in range(n)) if c]


def _finish(run: _Run) -> dict[str, list | KernelFailure]:
    for w in run.workers:  # every run sent before this one has been collected: its replies come next
        if not run.queues[w]:
            continue
        # Never sent, or sent to a child since stopped or replaced (it died on, or was stopped during, an
        # earlier run, before reading this one's messages): sent again. A child that died on this run's
        # own ranks is still connected; its replies and its death are read below as usual.
        if run.sent_to.get(w) != w.generation or w.conn is None:
            tasks = [(p, list(r), not batched) for p, r, batched in run.queues[w]]
            run.queues[w].clear()
            _send(run, w, tasks)
        _due(run, w)
    live = {w for w in run.workers if run.queues[w]}
    try:
        while live:
            _collect(run, live)
    finally:
        _stop_busy(run)
    for p, (failure, ranks) in run.retried.items():
        if not run.fails[p]:  # run again rank by rank, every one completed: the loss stands, on the chunk
            run.fails[p].append(replace(failure, message=_not_reproduced(failure, ranks)))
    results: dict[str, list | KernelFailure] = {}
    world = run.s.cp.world
    for p in run.paths:
        if run.fails[p]:
            results[p] = _first_failure(run.fails[p], [r for r in range(world) if r not in run.outs[p]])
        else:
            results[p] = [run.outs[p][r] for r in range(world)]
    return results


def _not_reproduced(failure: KernelFailure, ranks: list[int]) -> str:
    where = f"on rank {ranks[0]}" if len(ranks) == 1 else f"on one of ranks {ranks[0]}-{ranks[-1]}"
    return (failure.message.replace(f"on rank {ranks[0]}", where, 1)
            + "; run again one rank at a time, every one completed")


def _stop_busy(run: _Run) -> None:
    for w, queue in run.queues.items():
        if queue:  # an error (a ConfigError) left a child mid-run: its replies are stale
            w.stop()
            queue.clear()


def _first_failure(fails: list[KernelFailure], without_output: list[int]) -> KernelFailure:
    """The lowest failing rank is the path's failure, the others named in it; ``not_run`` lists
    the ranks that never ran (a chunk stops at its failure)."""
    first = first_failure(fails)
    failed = {f.rank for f in fails}
    first.not_run = [r for r in without_output if r not in failed]
    return first


_FRAME = struct.Struct("!i")
_tokens = itertools.count()  # one per run: names the scenario a worker holds


def _send(run: _Run, w: Worker, tasks: list) -> None:
    """Send ``w`` every task (path, ranks[, one_by_one]) at once, behind those it has (a kernel the
    child cannot reload runs here, unprotected). The child answers them in order: a reply per rank,
    or, for cpsim's own kernels, one reply per task (``_batched``)."""
    for task in tasks:
        path, ranks, one_by_one = task if len(task) == 3 else (*task, False)
        kernel = run.kernels.get(path)
        if w.ensure(run.device):
            w.ready()
        run.sent_to[w] = w.generation
        batched = _batched(kernel) and not one_by_one
        try:
            frames = []
            if w.loaded != run.token:  # the scenario and this worker's allocations travel once, not once per path
                frames.append(_load_message(run, ranks))
                w.loaded = run.token
            frames.append(ForkingPickler.dumps(("run_ranks", path, run.token, ranks, run.device,
                                                [run.knobs[r] for r in ranks], _record(kernel), batched)))
            _send_frames(w.conn, frames)
        except (EOFError, OSError):
            pass  # the next receive sees the dead child and names it
        run.queues[w].append([path, list(ranks), batched])
        if len(run.queues[w]) == 1:
            _due(run, w)


def _load_message(run: _Run, ranks: list[int]) -> bytes:
    """The scenario and the allocations of ``ranks``, pickled once per run however many workers get it."""
    key = tuple(ranks)
    if key not in run.loads:
        run.loads[key] = bytes(ForkingPickler.dumps(("load", run.token, run.s, {r: run.allocs[r] for r in ranks})))
    return run.loads[key]


FRAMES_JOINED = 1 << 16  # bytes of messages written in one system call; larger ones go one by one (no copy)


def _send_frames(conn, payloads: list) -> None:
    """``conn.send_bytes`` of each payload, in order, as one write when they are small: the same bytes
    (``multiprocessing.connection``'s framing, a 4-byte big-endian length before each message), one
    system call and one wake-up of the child per task instead of two. The fuzz parent sends a scenario
    and its run together to up to four workers for every scenario (tests/test_isolation.py reads such
    writes back through ``Connection.recv``)."""
    if sum(len(p) for p in payloads) > FRAMES_JOINED:
        for p in payloads:
            conn.send_bytes(p)
        return
    buf = memoryview(b"".join(_FRAME.pack(len(p)) + bytes(p) for p in payloads))
    fd = conn.fileno()
    while buf:
        buf = buf[os.write(fd, buf):]


def _batched(kernel) -> bool:
    """Whether a chunk's replies come back as one message. Only for cpsim's own kernels, which do
    not attack the worker: a chunk lost without its reply is run again rank by rank (``_collect``),
    which is what pins a crash or a hang on a rank. A user's kernel always answers rank by rank."""
    return kernel is None


def _due(run: _Run, w: Worker) -> None:
    """The deadline of ``w``'s next reply: one rank run's bound, or a batched chunk's ranks' bounds."""
    import time
    _, ranks, batched = run.queues[w][0]
    run.deadline[w] = time.monotonic() + _config.timeout_s * (len(ranks) if batched else 1)


def _collect(run: _Run, live: set) -> None:
    import time
    timeout = max(0.0, min(run.deadline[w] for w in live) - time.monotonic())
    ready = _readable(list(live), timeout)
    for w in list(live):
        queue = run.queues[w]
        path, ranks, batched = queue[0]
        kernel = run.kernels.get(path)
        if w in ready:
            reply = w._read(max(1.0, run.deadline[w] - time.monotonic()))
        elif time.monotonic() >= run.deadline[w]:
            reply = wire.Timeout()
        else:
            continue
        lost = isinstance(reply, (*LOST, wire.LostOnReadback))
        if lost and batched:
            # Which rank of the chunk crashed or hung is unknown: a fresh child runs its ranks again,
            # one reply each, and names it. Should they all complete, the loss is still reported.
            failure = w.lost(reply, path, ranks[0], kernel, _config.timeout_s * len(ranks)).failure
            run.retried[path] = (failure, list(ranks))
            rest = [(path, list(ranks), True)] + [(p, list(r), not b) for p, r, b in queue[1:]]
            queue.clear()
            _send(run, w, rest)
            continue
        if lost:
            run.fails[path].append(w.lost(reply, path, ranks[0], kernel, _config.timeout_s).failure)
            ranks.clear()
        else:
            for one in (reply.replies if isinstance(reply, wire.Batch) and batched else [reply]):
                if not _answered(run, w, path, ranks, kernel, one):
                    break
        if not ranks:
            queue.pop(0)
            if lost and queue:  # the child died with the later paths' chunks: a fresh one gets them
                rest = [(p, list(r), not b) for p, r, b in queue]
                queue.clear()
                _send(run, w, rest)
        if queue:
            _due(run, w)
        else:
            live.discard(w)


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


def _pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when ``pid`` ends (Linux 5.3+), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _answered(run: _Run, w: Worker, path: str, ranks: list, kernel, reply) -> bool:
    """Take one rank's reply (the first of ``ranks``); False when the chunk stops there."""
    rank = ranks[0]
    try:
        out = w.answer(reply, path, rank, kernel)
    except KernelFailed as e:
        run.fails[path].append(e.failure)
        ranks.clear()
        return False
    run.outs[path][rank] = out
    ranks.pop(0)
    if run.on_rank is not None:
        run.on_rank(path, rank)
    return True


def _sequential(path: str, s, allocs, device, knobs, kernel, on_rank, ranks, outs: dict | None = None,
                fails: list | None = None) -> list | KernelFailure:
    """Ranks run here in turn, stopping at the first that fails. With ``outs`` / ``fails`` given,
    fills them (a chunk of ``run_paths``); else returns the path's result."""
    got: dict = {} if outs is None else outs
    stage = prep.for_ranks(s, {r: allocs[r] for r in ranks}, device, builtin=kernel is None)
    for r in ranks:
        try:
            got[r] = _in_process(path, s, allocs[r], r, device, knobs[r], kernel, stage.for_rank(r))
        except KernelFailed as e:
            if fails is not None:
                fails.append(e.failure)
                return e.failure
            e.failure.not_run = list(range(r + 1, s.cp.world))
            return e.failure
        if on_rank is not None:
            on_rank(path, r)
    return [got[r] for r in ranks]


def run_rank(path: str, s, allocs, rank: int, device, knobs: Knobs = Knobs(), kernel=None,
             builtin_in_worker: bool = True) -> RankOutput | None:
    """``run_path`` for one rank under the configured isolation; raises ``KernelFailed``."""
    device = str(device)
    failure = _unloaded(path, kernel, rank, s.cp.world)
    if failure is not None:
        raise KernelFailed(failure)
    # A capture records the launches of this process: the worker's would go unrecorded.
    if not _config.process or (kernel is None and not builtin_in_worker) or recording.active() is not None:
        return _in_process(path, s, allocs, rank, device, knobs, kernel)
    _settle()  # the worker answers in order: runs started ahead first
    return _worker.run(path, s, allocs, rank, device, knobs, kernel, _config.timeout_s)


def run_rank_checked(path: str, s, allocs, rank: int, device, knobs: Knobs = Knobs(), kernel=None
                     ) -> RankOutput | None:
    """``run_rank`` for a torchrun rank, its slots on ``device``; raises ``KernelFailed``.

    Only the user's kernels go to the worker here: every torchrun rank is already its own
    process with bounded collectives, and a second process per rank for cpsim's own
    kernels would double the processes on an oversubscribed host for no protection.
    The guard entries travel with the slots (``cpsim.run.distrun``), so a broken guard is
    judged by the coordinator (``guard-intact``) as in the virtual world.
    """
    out = run_rank(path, s, allocs, rank, device, knobs, kernel, builtin_in_worker=False)
    if out is None:
        return None
    out.slots = out.slots.to(torch.device(device))
    return out


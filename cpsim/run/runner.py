"""Kernels run in a child process, bounded in time, so that nothing they do can end the run well.

The kernel under test is hostile input: it may raise, crash the interpreter
(an out-of-bounds store under the Triton interpreter is a SIGSEGV), never return,
or call ``sys.exit(0)`` / ``os._exit(0)``. In cpsim's own process any of these
would lose the report, hang the run or - worst - end it with exit code 0. So
every rank run of a path (``cpsim.paths.run_path``) goes to a persistent worker
process and comes back as a ``RankOutput`` or as a ``KernelFailure`` the
coordinator reports (invariant ``kernel-completes``, exit 1).

Why a persistent worker, a fresh interpreter (``cpsim.run.boot.start_child``): ``fork`` from a process
that has started torch's thread pools may deadlock in the child, and a new process per rank run costs a
torch import each time (seconds on a busy CPU). The worker imports torch and cpsim once, stays up for the
whole command (fuzz reuses it across scenarios) and is only replaced after a crash or a timeout.
``cpsim run`` starts its pool's interpreters before it imports torch itself (``boot.HeadStart``, adopted
by the runner), so that they import torch and cpsim on the other core meanwhile. The virtual world (``run_paths``) cuts each
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

All of it is held by a ``KernelRunner``: its configuration, its workers (``cpsim.run.worker``), the
rank runs started ahead (``cpsim.run.ahead``); ``cpsim.run.chunks`` cuts a call into chunks,
``cpsim.run.in_process`` is the unprotected way. The caller builds the runner and hands it down (a
command builds one from its options, ``cpsim.cli.main``; a long-lived caller keeps one, so its warm
workers serve every call); a call handed none runs on one of its own (``given``).

``CPSIM_KERNEL_ISOLATION=0`` runs kernels in-process (exceptions and ``sys.exit``
still become failures; crashes and hangs are not caught) - for debugging only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch

from cpsim import recording
from cpsim.errors import ConfigError
from cpsim.paths import KernelFailure, Knobs, RankOutput
from cpsim.run import chunks, requests, wire
from cpsim.run.ahead import RunAhead
from cpsim.run.boot import HeadStart
from cpsim.run.in_process import _in_process, _sequential, call_here, probe_here
from cpsim.run.outcome import KernelFailed, _exit_text, _unloaded
from cpsim.run.worker import LOST, WorkerPool, _record

DEFAULT_TIMEOUT_S = 300.0
TORCHRUN_SHARE = 0.75  # of --timeout: the default kernel bound under torchrun


@dataclass(frozen=True)
class Isolation:
    process: bool = True                # run kernels in the worker process
    timeout_s: float = DEFAULT_TIMEOUT_S  # wall-clock bound of one rank run of one path


def from_environment() -> Isolation:
    return Isolation(process=os.environ.get("CPSIM_KERNEL_ISOLATION", "1") != "0")


class KernelRunner:
    """Runs kernels under isolation: owns its configuration, its pool of worker processes (and the
    process groups they lead), the rank runs started ahead and their results. Everything a kernel
    run needs in the parent lives here; ``end`` ends the workers (at exit, at the latest)."""

    def __init__(self, config: Isolation | None = None, head_start: HeadStart | None = None) -> None:
        """``head_start``: worker interpreters the caller started before it imported torch (``cpsim.run.boot``)."""
        self.config = from_environment() if config is None else config
        self.pool = WorkerPool(head_start)
        self.run_ahead = RunAhead()
        atexit.register(self.end)  # the workers end with this process at the latest

    def __enter__(self) -> "KernelRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the workers now, and forget the exit hook (a runner of one call, ``given``)."""
        self.end()
        atexit.unregister(self.end)

    def configure(self, timeout_s: float | None = None, process: bool | None = None) -> Isolation:
        if timeout_s is not None:
            if not timeout_s > 0 or timeout_s == float("inf"):
                raise ConfigError("--kernel-timeout", f"must be a finite number of seconds > 0, got {timeout_s:g}")
            self.config = replace(self.config, timeout_s=float(timeout_s))
        if process is not None:
            self.config = replace(self.config, process=process)
        return self.config

    def configure_from_args(self, args) -> Isolation:
        """``--kernel-timeout``, else ``--timeout``, else the default bound (a runner kept across commands
        takes each command's bound).

        Under torchrun the default is ``TORCHRUN_SHARE`` of ``--timeout``: the peers wait at most
        ``--timeout`` in the gather that follows the kernel, so a hanging kernel must be stopped
        (and its failure gathered into the report) before they give up on the rank.
        """
        t = getattr(args, "kernel_timeout", None)
        if t is None:
            t = getattr(args, "timeout", None)
            if t is not None and t > 0 and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
                t = t * TORCHRUN_SHARE
        return self.configure(DEFAULT_TIMEOUT_S if t is None else t)

    def end(self) -> None:
        """End the workers and whatever they and their kernels left (``WorkerPool.end``)."""
        self.pool.end()

    def sweep_escaped(self) -> list[int]:
        return self.pool.sweep_escaped()

    def _in_worker(self) -> bool:
        # A capture records the launches of this process: the worker's would go unrecorded.
        return self.config.process and recording.active() is None

    def run_paths(self, s, paths: list[str], allocs: list, device, knobs: list[Knobs], kernels: dict,
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
            got = self.run_paths(s, rest, allocs, device, knobs, kernels, on_rank) if rest else {}
            return {p: unloaded[p] if p in unloaded else got[p] for p in paths}
        if not self._in_worker():
            return {p: _sequential(p, s, allocs, device, knobs, kernels.get(p), on_rank, range(world)) for p in paths}
        got = self.run_ahead.take(s, paths, device, knobs, kernels)
        if got is not None:
            return got
        return chunks.finish(self._start(s, paths, allocs, device, knobs, kernels, on_rank))

    def _start(self, s, paths, allocs, device: str, knobs, kernels, on_rank) -> chunks._Run:
        return chunks.start(self.pool, bool(self.run_ahead.inflight), self.config.timeout_s, s, paths, allocs,
                            device, knobs, kernels, on_rank)

    def ahead(self, s, paths: list[str], allocs: list, device, knobs: list[Knobs], kernels: dict) -> bool:
        """Start the rank runs of a ``run_paths`` call the caller will make later, and return at once, so
        the workers run them while the caller works on something else (``cpsim.run.ahead``). False
        (nothing started) in-process, under a capture, or with ``DEPTH`` scenarios already in flight."""
        if not self._in_worker() or self.run_ahead.full():
            return False
        if any(_unloaded(p, kernels.get(p), 0, 1) is not None for p in paths):
            return False
        self.run_ahead.inflight.append(self._start(s, paths, allocs, str(device), knobs, kernels, None))
        return True

    def forget_ahead(self) -> None:
        """Wait for the runs in flight and drop every result nobody asked for (the end of a search)."""
        self.run_ahead.forget()

    def _first_worker(self, device: str):
        """The pool's first worker, ready for ``device``, once the runs started ahead are collected
        (the worker answers in order)."""
        self.run_ahead.settle()
        w = self.pool.first
        spawned = w.ensure(device)
        self.pool.tell(device)  # the others started ahead prepare while this one answers
        if spawned:
            w.ready()
        return w

    def probe(self, spec: str, path: str, shim_vllm: bool, device: str, where: str):
        """A kernel's ``Signature``, read by a kernel worker that imports it, within ``--kernel-timeout``;
        a ``LoadFailure`` when the import raised, exited, hung or crashed. This process never imports it
        (the oracle stays out of the kernel's reach: the worker is another process, and what it sends
        back is plain data). In-process where isolation is off."""
        from cpsim.kernels.under_test import LoadFailure, Signature
        if not self.config.process:
            return probe_here(spec, path, shim_vllm, device, where)
        worker = self._first_worker(device)
        timeout = self.config.timeout_s
        reply = worker._ask(requests.Probe(spec, path, shim_vllm, device, where), timeout)
        if isinstance(reply, wire.SignatureRead):
            return Signature(reply.name, reply.triton, reply.is_callable, tuple(reply.params), reply.origin,
                             release=reply.release)
        if isinstance(reply, wire.Refused):
            raise ConfigError(reply.field, reply.rule)
        if isinstance(reply, wire.Unloaded):
            return LoadFailure(reply.kind, reply.message)
        what = f"{'file ' + spec.rpartition(':')[0] if ':' in spec else spec}"
        if isinstance(reply, wire.Timeout):
            worker.stop()
            return LoadFailure("timeout", f"did not finish importing {what} within {timeout:g} s (worker killed)")
        if not isinstance(reply, wire.Dead):
            worker.stop()
            why = reply.why if isinstance(reply, wire.Garbled) else f"a {type(reply).__name__}"
            return LoadFailure("garbled", f"sent a reply that is not well-formed plain data ({why}) while {what} "
                                          f"was imported (worker killed, nothing of it was unpickled)")
        try:
            code = worker.proc.wait(5)
        except Exception:  # noqa: BLE001
            code = None
        worker.stop()
        kind, text = _exit_text(code)
        return LoadFailure(kind, f"{text} while {what} was imported")

    def call(self, fn: Callable, path: str, kernel, *args, rank: int = 0, device: str = "cpu"):
        """``fn(kernel, *args)`` run in a kernel worker that loads the user's ``kernel`` there, within
        ``--kernel-timeout``: for rank runs that are not a scenario's (a capture's or an explicit
        batch's steps rerun, ``cpsim.capture.rerun``). ``fn`` is a module-level function (it travels by
        name) and returns an integer array or a tuple of them, sent back as plain data (``cpsim.run.wire``):
        nothing of the kernel's runs in this process. Raises ``KernelFailed`` naming ``rank`` when the kernel's
        import or the call raised, exited, crashed or hung. In-process where isolation is off."""
        device = str(device)
        failure = _unloaded(path, kernel, rank, 1)
        if failure is not None:
            raise KernelFailed(failure)
        if not self.config.process:
            return call_here(fn, path, kernel, args, rank, device)
        worker = self._first_worker(device)
        timeout = self.config.timeout_s
        reply = worker._ask(requests.Call(fn, path, _record(kernel), device, args), timeout)
        if isinstance(reply, LOST):
            raise worker.lost(reply, path, rank, kernel, timeout)
        return worker.answer(reply, path, rank, kernel)

    def run_rank(self, path: str, s, allocs, rank: int, device, knobs: Knobs = Knobs(), kernel=None,
                 builtin_in_worker: bool = True) -> RankOutput | None:
        """``run_path`` for one rank under the configured isolation; raises ``KernelFailed``."""
        device = str(device)
        failure = _unloaded(path, kernel, rank, s.cp.world)
        if failure is not None:
            raise KernelFailed(failure)
        if not self._in_worker() or (kernel is None and not builtin_in_worker):
            return _in_process(path, s, allocs, rank, device, knobs, kernel)
        self.run_ahead.settle()  # the worker answers in order: runs started ahead first
        return self.pool.first.run(path, s, allocs, rank, device, knobs, kernel, self.config.timeout_s)

    def run_rank_checked(self, path: str, s, allocs, rank: int, device, knobs: Knobs = Knobs(), kernel=None
                         ) -> RankOutput | None:
        """``run_rank`` for a torchrun rank, its slots on ``device``; raises ``KernelFailed``.

        Only the user's kernels go to the worker here: every torchrun rank is already its own
        process with bounded collectives, and a second process per rank for cpsim's own
        kernels would double the processes on an oversubscribed host for no protection.
        The guard entries travel with the slots (``cpsim.run.distrun``), so a broken guard is
        judged by the coordinator (``guard-intact``) as in the virtual world.
        """
        out = self.run_rank(path, s, allocs, rank, device, knobs, kernel, builtin_in_worker=False)
        if out is None:
            return None
        out.slots = out.slots.to(torch.device(device))
        return out


@contextlib.contextmanager
def given(runner: KernelRunner | None) -> Iterator[KernelRunner]:
    """``runner``, the caller's (a command's, a test session's: its warm workers serve every call); where
    the caller has none, a runner of the call's own, built from the environment and ended on return."""
    if runner is not None:
        yield runner
        return
    with KernelRunner() as own:
        yield own

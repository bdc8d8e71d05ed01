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

import collections
import itertools
import os
from dataclasses import dataclass, replace
from multiprocessing.reduction import ForkingPickler
from typing import Callable

import torch

from cpsim import recording
from cpsim.errors import ConfigError
from cpsim.paths import KernelFailure, Knobs, RankOutput
from cpsim.run import wire
from cpsim.run.chunks import (_answered, _batched, _first_failure, _load_message,  # noqa: F401
                              _not_reproduced, _Run, _send_frames, _shares, _stop_busy)
from cpsim.run.in_process import _in_process, _sequential
from cpsim.run.outcome import KernelFailed, _exit_text, _fail, _unloaded, raised_text  # noqa: F401
from cpsim.run.worker import (LOST, Worker, _pool, _readable, _record, _worker, pool_size,  # noqa: F401
                              sweep_escaped, usable_cores, _end_groups)

DEFAULT_TIMEOUT_S = 300.0


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


"""One ``run_paths`` call cut into chunks of ranks, one message per worker, and the replies taken back."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field, replace
from multiprocessing.reduction import ForkingPickler
from typing import Callable

from cpsim.paths import KernelFailure, first_failure
from cpsim.run.outcome import KernelFailed
from cpsim.run import requests, wire
from cpsim.run.boot import pool_size
from cpsim.run.worker import LOST, Worker, WorkerPool, _readable, _record


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
    timeout_s: float  # one rank run's bound
    sent_to: dict = field(default_factory=dict)  # worker -> its generation the queue was sent to (None: unsent)
    retried: dict = field(default_factory=dict)  # path -> (failure, ranks): a batched chunk lost, run again
    loads: dict = field(default_factory=dict)    # ranks -> the pickled ``Load`` request for them

    def matches(self, s, paths, device, knobs, kernels) -> bool:
        return (self.s is s and self.paths == list(paths) and self.device == str(device)
                and self.knobs == list(knobs) and self.kernels.keys() == kernels.keys()
                and all(self.kernels[p] is kernels[p] for p in kernels))


def start(pool: WorkerPool, busy: bool, timeout_s: float, s, paths, allocs, device: str, knobs, kernels,
          on_rank) -> _Run:
    """Send a ``run_paths`` call's chunks to ``pool``'s workers and return at once (``finish`` collects
    them). ``busy``: runs started ahead are still in flight in the workers."""
    world = s.cp.world
    size = pool_size(device)
    if device.split(":")[0] != "cpu" and size < 2 * len(paths):  # whole paths per worker (``_shares``)
        size = min(size, max(1, len(paths)))
    pool.grow(size)
    # With runs in flight a worker's replies to them are still due: it is neither restarted nor
    # waited for here; a dead one gets this run's chunks when the run is collected (``finish``).
    if not busy:
        spawned = [w for w in pool[:size] if w.ensure(device)]
        for w in spawned:
            w.ready()
    token = next(pool.tokens)
    shares = _shares(list(paths), world, size, device)
    # Each run starts at another worker, so that runs queued one behind the other with fewer shares
    # than workers (CP 1, say) still go to different workers.
    workers = [pool[(token + k) % size] for k in range(len(shares))]
    run = _Run(s, list(paths), allocs, device, list(knobs), kernels, on_rank, token, workers,
               {p: {} for p in paths}, {p: [] for p in paths}, {w: [] for w in workers}, {}, timeout_s)
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


def finish(run: _Run) -> dict[str, list | KernelFailure]:
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


def _load_message(run: _Run, ranks: list[int]) -> bytes:
    """The scenario and the allocations of ``ranks``, pickled once per run however many workers get it."""
    key = tuple(ranks)
    if key not in run.loads:
        run.loads[key] = bytes(ForkingPickler.dumps(requests.Load(run.token, run.s, {r: run.allocs[r] for r in ranks})))
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
            frames.append(ForkingPickler.dumps(requests.RunRanks(path, run.token, ranks, run.device,
                                                               [run.knobs[r] for r in ranks], _record(kernel),
                                                               batched)))
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
    run.deadline[w] = time.monotonic() + run.timeout_s * (len(ranks) if batched else 1)


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
            failure = w.lost(reply, path, ranks[0], kernel, run.timeout_s * len(ranks)).failure
            run.retried[path] = (failure, list(ranks))
            rest = [(path, list(ranks), True)] + [(p, list(r), not b) for p, r, b in queue[1:]]
            queue.clear()
            _send(run, w, rest)
            continue
        if lost:
            run.fails[path].append(w.lost(reply, path, ranks[0], kernel, run.timeout_s).failure)
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

"""One ``run_paths`` call cut into chunks of ranks, one message per worker, and the replies taken back."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Callable

from cpsim.paths import KernelFailure, first_failure
from cpsim.run.outcome import KernelFailed
from cpsim.run.worker import Worker


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

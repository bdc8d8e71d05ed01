"""The torchrun flow: each rank runs the paths for its own total CP rank, the CP
group all-gathers the outputs, the group's first rank runs the coordinator, and
every verdict reaches every rank (rank 0 prints them).

World layout: W = R x N ranks, CP groups of N consecutive global ranks; group
``g`` is replica ``g`` and runs its scenario with seed ``seed + g``. Inside a
group, position ``i`` is total CP rank ``i = pcp_rank * DCP + dcp_rank``.

Test hooks (environment variables, read on every rank; used by tests/test_dist.py):
``CPSIM_TEST_EXIT_RANK=r`` rank r exits abruptly after the fingerprint check;
``CPSIM_TEST_RAISE_RANK=r`` rank r raises inside its first path;
``CPSIM_TEST_SEED_RANK=r`` rank r builds its scenario with a different seed;
``CPSIM_TEST_FAULT_RANK=r`` rank r runs the kernels with ``CPSIM_TEST_FAULT`` fault bits (default 1);
``CPSIM_TEST_WARMUP_EXIT_RANK=r`` rank r exits just before warming up its CP group (read in ``cpsim.run.comm``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

import cpsim
from cpsim.check import coordinator
from cpsim.allocator import allocate_rank, allocate_world
from cpsim.check.coordinator import Example, Verdict, Violation
from cpsim.errors import DistError
from cpsim.layout import POISON
from cpsim.paths import KernelFailure, Knobs, RankOutput, first_failure
from cpsim.run.outcome import KernelFailed
from cpsim.run.runner import KernelRunner, given
from cpsim import scenario as sc
from cpsim.scenario import Scenario
from cpsim.run.world import failed, knobs_for, stack


@dataclass
class Entry:
    """One scenario family to check: ``build(replica)`` gives replica ``replica``'s scenario."""

    label: str
    build: Callable[[int], Scenario]
    cp_size: int
    paths: list[str]
    knobs: Knobs = Knobs()               # an injected fault ...
    inject_rank: int | None = None       # ... on this CP rank only (None: every rank)
    kernels: dict = field(default_factory=dict)  # path -> user kernel replacing the built-in one
    profile: object = None               # the release profile judging (cpsim.check.profiles; None: cpsim)


@dataclass
class GroupResult:
    """What one CP group found for one entry."""

    label: str
    group: int
    ranks: list[int]
    scenario: Scenario
    verdicts: list[Verdict]
    skipped: list[str] = field(default_factory=list)


@dataclass
class RankInfo:
    rank: int
    host: str
    pid: int
    device: str
    timings: dict = field(default_factory=dict)  # seconds per phase (see PHASES)


# What a CP group's result (``GroupResult``) may hold, for the plain-data gather (``cpsim.run.plain``).
RESULT_CLASSES = (GroupResult, Verdict, Violation, Example, *sc.DATA_CLASSES)


# Per-rank wall time by phase: start-up (cpsim import to process group ready), the
# kernels of every path, the all-gathers of their outputs, the coordinator (first
# rank of a CP group only).
PHASES = ("startup", "kernels", "gather", "check")


class RankWork:
    """What one rank's entries share: the runner of its kernels and its wall time by phase (``PHASES``)."""

    def __init__(self, runner: KernelRunner) -> None:
        self.runner = runner
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0


@dataclass(frozen=True)
class Hooks:
    exit_rank: int | None = None
    raise_rank: int | None = None
    seed_rank: int | None = None
    fault_rank: int | None = None
    fault: int = 1

    @staticmethod
    def from_environ() -> "Hooks":
        def num(name):
            v = os.environ.get(name, "")
            return int(v) if v.strip() else None
        return Hooks(num("CPSIM_TEST_EXIT_RANK"), num("CPSIM_TEST_RAISE_RANK"), num("CPSIM_TEST_SEED_RANK"),
                     num("CPSIM_TEST_FAULT_RANK"), num("CPSIM_TEST_FAULT") or 1)


SEED_HOOK_DELTA = 1000


def _fp_words(fp: str) -> list[int]:
    return [int(fp[:8], 16), int(fp[8:16], 16)]


def _fp_text(hi: int, lo: int) -> str:
    return f"{hi:08x}{lo:08x}"


def _plan_hash(entry: Entry, world: int) -> int:
    """What every rank must agree on besides the scenario: the collectives it will issue."""
    text = f"{entry.label}|{entry.cp_size}|{','.join(entry.paths)}|{world}"
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


# The first column of a rank's meta row: what its run of the path gave.
NOT_APPLICABLE, RAN, FAILED = 0, 1, 2
META = 6  # columns before the per-group ones: status, width (or failure length), total, pcp, dcp, guard width
INPUTS = 4  # per group after enabled, widths, entry sizes: input entries written (``cpsim.paths._intact``),
# then one column per group: a callable's output fault code (``cpsim.paths.adapters.output_fault``)


def _meta(out: RankOutput | None, G: int, total_rank: int, dcp: int, failure: bytes = b"") -> torch.Tensor:
    head = [total_rank, total_rank // dcp, total_rank % dcp]
    if out is None:
        status = FAILED if failure else NOT_APPLICABLE
        return torch.tensor([status, len(failure)] + head + [0] + [0] * ((4 + INPUTS) * G), dtype=torch.int64)
    gw = 0 if out.guard is None else out.guard.shape[1]
    written = [-1] * (INPUTS * G) if out.written is None else out.written.flatten().tolist()
    written += [-1] * G if out.output_faults is None else list(out.output_faults)
    return torch.tensor([RAN, out.slots.shape[1]] + head + [gw]
                        + [int(x) for x in out.enabled] + list(out.widths) + list(out.entry_sizes) + written,
                        dtype=torch.int64)


def _encode(failure: KernelFailure | None) -> bytes:
    return b"" if failure is None else json.dumps(dataclasses.asdict(failure)).encode()


def _gather_path(comm, pg, N: int, s: Scenario, path: str, out: RankOutput | None, total_rank: int,
                 label: str, failure: KernelFailure | None = None
                 ) -> tuple[list[RankOutput] | None, list[KernelFailure]]:
    """The CP group's outputs in total-rank order (on every member), or the failures of the ranks whose
    kernel did not complete; (None, []) if the path does not apply.

    Every member takes the same branch from the gathered meta rows, so the collectives stay aligned:
    when any rank failed, the group exchanges the failure records instead of the slots.
    """
    G = len(s.groups)
    blob = _encode(failure)
    meta = comm.all_gather(_meta(out, G, total_rank, s.cp.dcp, blob), pg, N, f"{label}: {path} meta").view(N, -1)
    status = meta[:, 0]
    for i in range(N):
        total, pcp_rank, dcp_rank = (int(x) for x in meta[i, 2:5])
        if total != i or pcp_rank * s.cp.dcp + dcp_rank != i:
            raise DistError(f"{label}: gathered position {i} holds total rank {total} "
                            f"(pcp {pcp_rank} x DCP {s.cp.dcp} + dcp {dcp_rank}); expected {i}")
    if bool((status == FAILED).any()):
        width = int(meta[:, 1].max())
        mine = torch.zeros(width, dtype=torch.int64)
        mine[: len(blob)] = torch.tensor(list(blob), dtype=torch.int64)
        rows = comm.all_gather(mine, pg, N, f"{label}: {path} failures").view(N, width)
        return None, [KernelFailure(**json.loads(bytes(rows[i, : int(meta[i, 1])].tolist())))
                      for i in range(N) if int(status[i]) == FAILED]
    if not bool(status.any()):
        return None, []
    if not bool(status.all()):
        raise DistError(f"{label}: ranks {(status == 0).nonzero().flatten().tolist()} skipped path {path} "
                        f"that the others ran")
    # The guard entries around each output row travel with the slots: [guard | slots | POISON padding].
    gws = {int(x) for x in meta[:, 5]}
    gw = gws.pop() if len(gws) == 1 else 0
    width = int(meta[:, 1].max())
    mine = torch.full((G, gw + width), POISON, dtype=torch.int64)
    if gw:
        mine[:, :gw] = out.guard.cpu().to(torch.int64)
    mine[:, gw: gw + out.slots.shape[1]] = out.slots.cpu().to(torch.int64)
    slots = comm.all_gather(mine, pg, N, f"{label}: {path} slots").view(N, G, gw + width)
    outs = []
    for i in range(N):
        m = meta[i, META:].tolist()
        written = torch.tensor(m[3 * G:(3 + INPUTS) * G], dtype=torch.int64).view(G, INPUTS)
        faults = m[(3 + INPUTS) * G:]
        outs.append(RankOutput(slots[i, :, gw:], [bool(x) for x in m[:G]], m[G:2 * G], m[2 * G:3 * G],
                               slots[i, :, :gw] if gw else None, None if bool((written < 0).all()) else written,
                               None if any(f < 0 for f in faults) else faults))
    return outs, []


def run_entry(comm, entry: Entry, hooks: Hooks, device: torch.device, work: RankWork) -> list[GroupResult]:
    """Check one entry on every CP group of the world; every rank returns every group's result (its phases
    timed in ``work``)."""
    N = entry.cp_size
    g, pg = comm.cp_group(N)
    replicas = comm.world // N
    active = g >= 0
    pos = comm.rank - g * N
    s = None
    words = [-1, -1, -1]
    if active:
        comm.state(f"{entry.label}: building the scenario")
        s = entry.build(g + (SEED_HOOK_DELTA if hooks.seed_rank == comm.rank else 0))
        words = _fp_words(s.fingerprint()) + [_plan_hash(entry, comm.world)]
    table = comm.all_gather(torch.tensor(words, dtype=torch.int64), what=f"{entry.label}: fingerprints",
                            ctrl=True).view(comm.world, 3)
    plans = {int(table[r, 2]) for r in range(replicas * N)}
    if len(plans) > 1:
        raise DistError(f"{entry.label}: ranks were started with different arguments (plan hashes "
                        f"{sorted(plans)}); every rank must get the same cpsim command line")
    fps = [[_fp_text(int(table[r, 0]), int(table[r, 1])) for r in range(k * N, (k + 1) * N)]
           for k in range(replicas)]
    if hooks.exit_rank == comm.rank:
        print(f"[rank {comm.rank}] test hook CPSIM_TEST_EXIT_RANK: exiting abruptly", file=sys.stderr, flush=True)
        os._exit(3)

    result = None
    if active:
        same = coordinator.same_scenario(fps[g])
        ranks = list(range(g * N, (g + 1) * N))
        if same.status == "fail":
            # Mismatched groups skip the paths (as a whole group, so the collectives stay aligned).
            result = GroupResult(entry.label, g, ranks, s, [same]) if pos == 0 else None
        else:
            result = _run_group(comm, pg, entry, s, g, pos, ranks, fps[g], hooks, device, work)
    payloads = comm.all_gather_objects(result, f"{entry.label}: verdicts", RESULT_CLASSES)
    return [p for p in payloads if p is not None]


def _run_group(comm, pg, entry: Entry, s: Scenario, g: int, pos: int, ranks: list[int], fps: list[str],
               hooks: Hooks, device: torch.device, work: RankWork) -> GroupResult | None:
    N = entry.cp_size
    knobs = knobs_for(pos, entry.knobs, entry.inject_rank)
    if hooks.fault_rank == comm.rank:
        knobs = Knobs(kernel_fault=hooks.fault, host_sizing=knobs.host_sizing)
    allocs = allocate_rank(s, pos)
    gathered, skipped, failed_on = {}, [], {}
    for path in entry.paths:
        comm.state(f"{entry.label}: running {path}")
        if hooks.raise_rank == comm.rank:
            raise RuntimeError(f"test hook CPSIM_TEST_RAISE_RANK: rank {comm.rank} raised inside path {path}")
        failure = None
        with work.timed("kernels"):
            try:
                out = work.runner.run_rank_checked(path, s, allocs, pos, device, knobs, entry.kernels.get(path))
            except KernelFailed as e:  # the kernel's failure travels to the coordinator like its slots would
                out, failure = None, e.failure
            if out is not None and device.type == "cuda":
                torch.cuda.synchronize(device)  # count the launches' GPU time here, not in the gather
        if N == 1:
            outs, failures = (None if out is None else [out]), ([] if failure is None else [failure])
        else:
            with work.timed("gather"):
                outs, failures = _gather_path(comm, pg, N, s, path, out, pos, entry.label, failure)
        if failures:
            if pos == 0:
                gathered[path] = failed(path, s, first_failure(failures))
                failed_on[path] = [f.rank for f in failures]
        elif outs is None:
            skipped.append(path)
        elif pos == 0:
            gathered[path] = stack(path, outs)
    if pos != 0:
        return None
    comm.state(f"{entry.label}: checking")
    with work.timed("check"):
        verdicts = coordinator.check(s, allocate_world(s), gathered, fps, entry.profile)
    for v in verdicts:  # every rank ran at once: the violation names each rank whose kernel failed
        if v.invariant == "kernel-completes" and v.path in failed_on:
            for x in v.violations:
                x.ranks, x.count = failed_on[v.path], len(failed_on[v.path])
    return GroupResult(entry.label, g, ranks, s, verdicts, skipped)


def rank_info(comm, work: RankWork) -> RankInfo:
    return RankInfo(comm.rank, socket.gethostname(), os.getpid(), comm.dev.describe(),
                    {k: round(work.seconds.get(k, 0.0), 3) for k in PHASES})


def execute(args, entries: list[Entry], report: Callable, progress: Callable | None = None,
            stopped: Callable | None = None, runner: KernelRunner | None = None) -> int:
    """Run ``entries`` on this rank of a torchrun job; ``report(results, infos) -> code`` runs on rank 0.

    Never returns: every rank ends the process with the exit code the ranks agree on once rank 0
    has written its outputs (``Comm.finish``), or with 1 on a failure (``Comm.fail``), so torchrun
    cannot stop rank 0 mid-report because another rank left first. When the run stops early (a
    peer died, raised or never arrived; torchrun's SIGTERM) rank 0 calls
    ``stopped(results, infos, message, ranks)`` instead: the groups finished so far, its own rank
    info, its stop line and the ranks that line names as the cause. ``runner`` runs the kernels (the
    command's; none: one of its own), its workers ended before the rank leaves.
    """
    from torch.distributed.elastic.multiprocessing.errors import record

    with given(runner) as r:
        return record(_execute)(args, entries, report, progress, stopped, r)


def _execute(args, entries, report, progress, stopped, runner: KernelRunner) -> int:
    from cpsim.run.comm import Comm
    from cpsim.run.dist import Env, select_device

    env = Env.from_environ()
    dev = select_device(args.device, env.local_rank, env.local_world, args.oversubscribe)
    hooks = Hooks.from_environ()
    comm = Comm.init(env, dev, args.timeout, on_leave=runner.end)
    work = RankWork(runner)
    work.seconds["startup"] = time.time() - cpsim.STARTED
    try:
        results: list[GroupResult] = []
        for i, entry in enumerate(entries):
            results += run_entry(comm, entry, hooks, dev.device, work)
            if progress is not None and comm.rank == 0:
                progress(i, entry)
        infos = comm.all_gather_objects(rank_info(comm, work), "rank info", (RankInfo,))
        code = report(results, infos) if comm.rank == 0 else 0
        if comm.rank == 0:
            sys.stdout.flush()
            line = headline(results) if code == 1 else ""
            if line:
                from cpsim.run.comm import _record
                _record(DistError(line))  # the launch script's one line quotes it
    except BaseException as e:  # noqa: BLE001  (Comm.fail reports it to the peers and exits)
        comm.fail(e, None if stopped is None else
                  lambda message, ranks: stopped(results, [rank_info(comm, work)], message, ranks))
    # Rank 0 may still fail while reporting (an unwritable --json): everyone takes its code.
    try:
        comm.finish(code)
    except BaseException as e:  # noqa: BLE001
        comm.fail(e)


# ---- what rank 0 prints and writes ------------------------------------------------

HEADLINE = "report: "  # marks the error file rank 0 leaves for the launcher (cpsim.run.launcher.summary)


def headline(results: list[GroupResult]) -> str:
    """The failing groups and the first violation in one line ('' when every group passes)."""
    bad = [r for r in results if not coordinator.passed(r.verdicts)]
    for r in bad:
        for v in r.verdicts:
            if v.status == "fail" and v.violations:
                x = v.violations[0]
                return (f"{HEADLINE}{len(bad)} of {len(results)} CP group(s) fail; first: {r.label} CP group "
                        f"{r.group}: {v.invariant} [{v.path}] {x.message}")
    return ""


def print_ranks(console, infos: list[RankInfo], results: list[GroupResult]) -> None:
    from rich.table import Table

    where = {}
    for r in results:
        dcp = r.scenario.cp.dcp
        for i, rank in enumerate(r.ranks):
            where[rank] = (r.group, i, i // dcp, i % dcp)
    t = Table(title=f"{len(infos)} rank(s)", title_justify="left")
    for col in ("rank", "host", "pid", "device", "CP group", "total CP rank", "pcp", "dcp") + PHASES:
        t.add_column(col if col not in PHASES else f"{col} s",
                     justify="right" if col not in ("host", "device") else "left")
    for info in infos:
        g = where.get(info.rank)
        cells = [str(x) for x in g] if g else ["idle", "", "", ""]
        secs = [f"{info.timings[k]:.2f}" if k in info.timings else "" for k in PHASES]
        t.add_row(str(info.rank), info.host, str(info.pid), info.device, *cells, *secs)
    console.print(t)

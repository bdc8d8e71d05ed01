"""Run faults through the virtual world and the coordinator; build the detection matrix.

A fault counts as caught on a scenario only if the faulty run breaks an invariant
*and* the fault-free run of the same scenario and paths breaks none, so a
catch is always attributable to the injected fault.
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Callable

from cpsim.check import coordinator, profiles

from cpsim import faults, kernels
from cpsim.allocator import allocate_world
from cpsim.check.coordinator import Verdict
from cpsim.check.gathered import Gathered
from cpsim.check.ownership import Ownership, ranges  # noqa: F401  (re-exported)
from cpsim.check.ownership import ownership as _ownership
from cpsim.kernels.under_test import ABIS, from_record
from cpsim.paths import PATHS, Knobs
from cpsim.presets import PRESETS, preset
from cpsim.run.runner import KernelRunner, given
from cpsim.scenario import INT32_MAX, Scenario
from cpsim.run.world import run_virtual
from cpsim.kernels import use_interpreter


@dataclass
class Run:
    """One (scenario, knobs, paths) run: verdicts plus the gathered outputs."""

    scenario: Scenario
    verdicts: list[Verdict]
    gathered: dict[str, Gathered]
    seconds: float

    @property
    def failed(self) -> dict[str, list[str]]:
        """invariant -> paths on which it failed, in INVARIANTS order."""
        out: dict[str, list[str]] = {}
        for v in self.verdicts:
            if v.status == "fail":
                out.setdefault(v.invariant, []).append(v.path)
        return {k: out[k] for k in coordinator.INVARIANTS if k in out}

    @property
    def passed(self) -> bool:
        return coordinator.passed(self.verdicts)


def run(s: Scenario, knobs: Knobs = Knobs(), paths: tuple[str, ...] | list[str] = PATHS,
        inject_rank: int | None = None, device: str = "cpu", kernels: dict | None = None, profile=None,
        runner=None) -> Run:
    """``kernels``: path -> the user's kernel replacing the built-in one (fault bits do not reach it);
    ``profile``: the release profile judging (``cpsim.check.profiles``; None: cpsim's model), which also
    lays the scenario out as that release does; ``runner``: ``run_virtual``'s."""
    t0 = time.perf_counter()
    if profile is not None:
        s = profiles.scenario_for(s, profile)
    gathered = run_virtual(s, list(paths), knobs, inject_rank, device, kernels, runner=runner)
    verdicts = coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world, profile)
    return Run(s, verdicts, gathered, time.perf_counter() - t0)


def knobs(fault: faults.Fault, s: Scenario, fixed: bool = False) -> Knobs:
    """The injection on ``s``, or the fixed form's knobs."""
    return fault.fixed if fixed else fault.knobs_for(s)


def reproduce(fault: faults.Fault, fixed: bool = False, paths=PATHS, inject_rank: int | None = None,
              device: str = "cpu", kernels: dict | None = None, profile=None, runner=None) -> Run:
    s = fault.trigger()
    return run(s, knobs(fault, s, fixed), paths, inject_rank, device, kernels, profile, runner)


# ---- ownership: who holds which positions (cpsim.check.ownership) -------------

def ownership(r: Run) -> list[Ownership]:
    """``cpsim.check.ownership.ownership`` of a run."""
    return _ownership(r.scenario, r.gathered)


# ---- the detection matrix -----------------------------------------------------

@dataclass
class Cell:
    """One fault on one scenario."""

    fault: str
    scenario: str
    failed: dict[str, list[str]]        # faulty run: invariant -> paths
    baseline_failed: dict[str, list[str]]  # fault-free run of the same scenario and paths
    applicable: bool                    # some affected path ran on this scenario
    seconds: float
    why: str = ""                       # why the cell is n/a (the fault cannot reach or show there)

    @property
    def caught(self) -> bool:
        return self.applicable and bool(self.failed) and not self.baseline_failed


@dataclass
class Matrix:
    cells: list[Cell] = field(default_factory=list)

    def for_fault(self, name: str) -> list[Cell]:
        return [c for c in self.cells if c.fault == name]

    def caught(self, name: str) -> bool:
        return any(c.caught for c in self.for_fault(name))

    def applicable(self, name: str) -> bool:
        """A row counts when the fault can show in at least one of its cells."""
        return any(c.applicable for c in self.for_fault(name))

    @property
    def faults(self) -> list[str]:
        return list(dict.fromkeys(c.fault for c in self.cells))

    @property
    def rate(self) -> tuple[int, int]:
        """(caught, applicable rows): rows whose fault can reach no cell are not counted."""
        rows = [f for f in self.faults if self.applicable(f)]
        return sum(self.caught(f) for f in rows), len(rows)


# ---- where a fault can show with a user's kernels --------------------------------

# ABIs whose slot mapping is int32: slots past 2^31 - 1 cannot be written (vllm-ascend's v1/v2 kernels).
# Read from the ABI table, so a new int32 ABI (ascend-v2-0.18, say) is never judged on such slots.
INT32_SLOT_ABIS = tuple(n for n, a in ABIS.items() if a.out_dtype == "int32")


def _user(record: dict | None, path: str) -> tuple[dict | None, dict | None]:
    """(the path's user kernel entry or None, its user replay kernel entry or None) from a to_record dict."""
    item = (record or {}).get(path)
    if not isinstance(item, dict):
        return (({"spec": item, "abi": "auto"} if isinstance(item, str) and item != "builtin" else None), None)
    return (item if item.get("spec", "builtin") != "builtin" else None), item.get("replay") or None


def reaches(fault: faults.Fault, path: str, record: dict | None) -> str:
    """Why ``fault`` cannot reach ``path``'s kernels under ``record`` ("" when it can).

    Host-side knobs (table widths, block sizes, the slot buffer) shape the inputs of any kernel; the
    FAULT_* switches are compiled into cpsim's built-in kernels only, so they reach a path only where
    its kernel is built-in (the replay switches: where the replay-padding kernel is, or always for the
    host-side list of groups)."""
    k, replay = _user(record, path)
    if k is None and replay is None:
        return ""
    kn = fault.knobs
    if fault.knobs_fn is not None or kn.virtual_from_kernel_block or kn.unsharded_width_per_cp \
            or kn.sharded_width_undivided or kn.buffer_size:
        return ""
    bits = kn.kernel_fault
    replay_bits = bits & kernels.REPLAY_FAULTS
    if replay_bits and (replay is None or replay_bits & kernels.FAULT_REPLAY_ALL_GROUPS):
        return ""
    if k is None and ((bits & ~kernels.REPLAY_FAULTS) or kn.draft_overwrite):
        return ""
    what = "the replay-padding kernel" if replay_bits else "the kernel"
    return f"{what} under test on {path} is the user's: the fault is built into cpsim's own kernel or its launch"


def representable(s: Scenario, path: str, record: dict | None) -> str:
    """Why ``path``'s kernel cannot represent ``s`` ("" when it can): an int32 ABI and slots >= 2^31."""
    k, _ = _user(record, path)
    if k is None or k.get("abi") not in INT32_SLOT_ABIS:
        return ""
    top = max((g.num_blocks * g.block_size - 1 for g in s.groups if g.slot_mapped), default=0)
    if top > INT32_MAX:
        return f"the {k['abi']} ABI writes int32 slots; this scenario needs slots up to {top} (>= 2^31) on {path}"
    return ""


def cell_paths(fault: faults.Fault, s: Scenario, record: dict | None) -> tuple[tuple[str, ...], str]:
    """The affected paths where ``fault`` can show on ``s`` with these kernels, and why the others cannot."""
    keep, why = [], []
    for p in fault.paths:
        reasons = [r for r in (reaches(fault, p, record), representable(s, p, record)) if r]
        (why.extend(reasons) if reasons else keep.append(p))
    return tuple(keep), "; ".join(dict.fromkeys(why))


def baseline_paths(fault: faults.Fault, s: Scenario, record: dict | None) -> tuple[str, ...]:
    """The affected paths whose fault-free run is judged: every one the kernel can represent, reached by
    the fault or not, so a user's kernel that fails the fault-free scenario still shows "baseline fails"."""
    return tuple(p for p in fault.paths if not representable(s, p, record))


TRIGGER = "trigger"


def _task(fault_name: str | None, where: str, faulty: bool, seed: int, paths: tuple[str, ...],
          kernel_record: dict | None = None, runner=None) -> tuple:
    """One run, summarised as (failed, applicable, seconds); picklable both ways.

    Kernels under test travel as ``kernel_under_test.to_record`` dicts and are loaded by ``runner`` (the
    caller's, or its pool process's, ``_serve``), whose workers import kernel SPECs."""
    use_interpreter()
    f = faults.get(fault_name) if fault_name else None
    s = f.trigger() if where == TRIGGER else preset(where, seed=seed)
    with given(runner) as r:
        out = run(s, f.knobs_for(s) if (f and faulty) else Knobs(), paths,
                  kernels={p: k for p, k in from_record(kernel_record or {}, inspect=r.probe).items() if p in paths},
                  runner=r)
    return out.failed, bool(out.gathered), out.seconds


def _serve(todo, done) -> None:
    """A pool process: one kernel runner for every task it takes from ``todo`` (its workers stay warm
    from task to task) until a None; each task's ``(key, result)`` goes to ``done``, or ``(key, error)``
    when it raised. Ctrl-C is the parent's, which stops the pool (and prints one line)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with KernelRunner() as runner:
        while (item := todo.get()) is not None:
            key, args = item
            try:
                done.put((key, _task(*args, runner=runner)))
            except Exception as e:  # noqa: BLE001  (raised again in the parent, as a pool's future would)
                done.put((key, e))


def _pool(tasks: dict[tuple, tuple], jobs: int):
    """``(key, result)`` of every task as it completes, run by ``jobs`` processes (``_serve``)."""
    ctx = get_context("spawn")  # a fresh interpreter: no forked torch / Triton state
    todo, done = ctx.Queue(), ctx.Queue()
    for item in tasks.items():
        todo.put(item)
    procs = [ctx.Process(target=_serve, args=(todo, done), name=f"cpsim-matrix-{j}") for j in range(jobs)]
    for p in procs:
        todo.put(None)
        p.start()
    try:
        left = len(tasks)
        while left:
            try:
                key, got = done.get(timeout=1.0)
            except queue.Empty:
                if all(not p.is_alive() for p in procs):
                    raise RuntimeError(f"the detection matrix's processes ended with {left} task(s) left "
                                       f"(exit codes {[p.exitcode for p in procs]})") from None
                continue
            if isinstance(got, BaseException):
                raise got
            left -= 1
            yield key, got
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(10)


def matrix(names: list[str] | None = None, presets: tuple[str, ...] = PRESETS, seed: int = 0, jobs: int = 1,
           on_done: Callable[[str], None] | None = None, kernel_record: dict | None = None, runner=None) -> Matrix:
    """Every fault on its trigger and on each preset, on the paths it affects.

    Each trigger also runs fault-free on the same paths, and each preset runs
    fault-free once on all paths, so that a catch is attributable to the fault.
    With ``kernel_record`` (user kernels) a fault-free run that fails is the
    kernel's own bug: the cell shows "baseline fails" and the fault is not caught.
    ``runner`` runs the kernels where ``jobs`` is 1 (``run_virtual``'s); ``jobs`` processes keep one each.
    """
    names = names or faults.names()
    cat = {n: faults.get(n) for n in names}
    scen = {TRIGGER + ":" + n: f.trigger() for n, f in cat.items()} | {p: preset(p, seed=seed) for p in presets}
    where, base_on = {}, {}  # (fault, scenario) -> (paths the fault can show on, why not the others); baseline's
    for n, f in cat.items():
        for sc in (TRIGGER, *presets):
            s = scen[TRIGGER + ":" + n if sc == TRIGGER else sc]
            where[(n, sc)] = cell_paths(f, s, kernel_record)
            base_on[(n, sc)] = baseline_paths(f, s, kernel_record)
    tasks: dict[tuple, tuple] = {}
    for n, f in cat.items():
        ps = where[(n, TRIGGER)][0]
        if ps:
            tasks[(n, TRIGGER, True)] = (n, TRIGGER, True, seed, ps, kernel_record)
            tasks[(n, TRIGGER, False)] = (n, TRIGGER, False, seed, base_on[(n, TRIGGER)], kernel_record)
        for p in presets:
            if where[(n, p)][0]:
                tasks[(n, p, True)] = (n, p, True, seed, where[(n, p)][0], kernel_record)
    for p in presets:
        tasks[(None, p, False)] = (None, p, False, seed, PATHS, kernel_record)
    results: dict[tuple, tuple] = {}
    if jobs > 1:
        for k, got in _pool(tasks, jobs):
            results[k] = got
            if on_done:
                on_done(_label(k))
    else:
        with given(runner) as r:
            for k, a in tasks.items():
                results[k] = _task(*a, runner=r)
                if on_done:
                    on_done(_label(k))

    m = Matrix()
    for n, f in cat.items():
        ps, why = where[(n, TRIGGER)]
        if not ps:
            m.cells.append(Cell(n, TRIGGER, {}, {}, False, 0.0, why))
        else:
            failed, applicable, secs = results[(n, TRIGGER, True)]
            base, _, base_secs = results[(n, TRIGGER, False)]
            m.cells.append(Cell(n, TRIGGER, failed, base, applicable, secs + base_secs,
                                why if applicable else "no affected path runs there"))
        for p in presets:
            ps, why = where[(n, p)]
            if not ps:
                m.cells.append(Cell(n, p, {}, {}, False, 0.0, why))
                continue
            failed, applicable, secs = results[(n, p, True)]
            base = _restrict(results[(None, p, False)][0], base_on[(n, p)])
            m.cells.append(Cell(n, p, failed, base, applicable, secs, "" if applicable else
                                "no affected path runs there"))
    return m


def num_tasks(names: list[str] | None = None, presets: tuple[str, ...] = PRESETS, kernel_record: dict | None = None,
              seed: int = 0) -> int:
    """Runs ``matrix`` makes (cells where the fault cannot show are not run)."""
    if not kernel_record:
        n = len(names or faults.names())
        return n * (2 + len(presets)) + len(presets)
    count = len(presets)
    for n in names or faults.names():
        f = faults.get(n)
        count += 2 * bool(cell_paths(f, f.trigger(), kernel_record)[0])
        count += sum(bool(cell_paths(f, preset(p, seed=seed), kernel_record)[0]) for p in presets)
    return count


def _restrict(failed: dict[str, list[str]], paths: tuple[str, ...]) -> dict[str, list[str]]:
    """Baseline failures on the given paths only (cross-path and whole-run ones kept)."""
    out = {}
    for inv, ps in failed.items():
        keep = [p for p in ps if p in paths or p == "*" or ("~" in p and all(x in paths for x in p.split("~")))]
        if keep:
            out[inv] = keep
    return out


def _label(key: tuple) -> str:
    n, where, faulty = key
    return f"{n or 'fault-free'} on {where}{'' if faulty else ' (fixed)'}"


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 8))

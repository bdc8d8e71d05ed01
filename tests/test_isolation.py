"""A hostile kernel under test never yields exit 0, never hangs, never shows a traceback.

Each kernel in tests/kernels/hostile.py (callables) and the one-bug Triton kernels
beside it attacks the process or the memory around its buffers; cpsim must report a
named violation (exit 1) in the terminal and the JSON. The guard checks of the
coordinator are also fed broken gathered data directly, and must fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cpsim import cli
from cpsim.check import coordinator
from cpsim.layout import GUARD, table_guard_id
from cpsim.paths import KernelFailure
from cpsim.presets import preset
from cpsim.run import chunks, outcome, runner, worker
from cpsim.run.runner import Isolation
from kernel_load import RUNNER
from test_coordinator import SHARDED, broken, judge, world  # noqa: F401  (world is a fixture)

HERE = Path(__file__).parent
K = HERE / "kernels"
# A small scenario: 2 ranks, 1 group, 110 tokens; only the v1 path.
SMALL = ["run", "--scenario", "mtp", "--dcp", "2", "--paths", "v1"]


def _run(capsys, tmp_path, kernel: str, *extra: str) -> tuple[int, str, dict]:
    out = tmp_path / "r.json"
    code = cli.main([*SMALL, "--kernel-v1", kernel, "--json", str(out), *extra], runner=RUNNER)
    cap = capsys.readouterr()
    text = cap.out + cap.err
    assert "Traceback" not in text
    return code, " ".join(text.split()), json.loads(out.read_text())


def _failure(report: dict) -> str:
    [v] = [v for v in report["verdicts"] if v["invariant"] == "kernel-completes" and v["status"] == "fail"]
    assert report["passed"] is False
    rest = {x["status"] for x in report["verdicts"] if x["path"] == "v1" and x["invariant"] != "kernel-completes"}
    assert rest == {"not run"}  # nothing else was checked, and the report says so
    return v["violations"][0]["message"]


@pytest.mark.parametrize("name, phrase", [
    ("raises", "kernel raised ValueError: boom from cp_rank 0 at "),  # then the kernel's file:line and source
    ("segfault", "kernel crashed with SIGSEGV on rank 0"),
    ("sysexit", "kernel called sys.exit(0) on rank 0"),
    ("osexit", "kernel ended its process with exit code 0"),
])
def test_misbehaving_callable_is_a_named_violation(capsys, tmp_path, name, phrase):
    code, text, report = _run(capsys, tmp_path, f"{K}/hostile.py:{name}")
    assert code == 1
    assert phrase in text
    assert phrase in _failure(report)


def test_failure_is_in_every_report_format(capsys, tmp_path, monkeypatch):
    import xml.etree.ElementTree as ET
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "1")  # one process: rank 1 never runs after rank 0 failed
    html, xml = tmp_path / "r.html", tmp_path / "r.xml"
    code, text, report = _run(capsys, tmp_path, f"{K}/hostile.py:raises", "--html", str(html), "--junit", str(xml))
    assert code == 1
    phrase = "kernel raised ValueError: boom from cp_rank 0 at "
    assert phrase in _failure(report) and "hostile.py:14" in _failure(report)
    assert "on rank 0, group attn" in _failure(report) and "rank 1 not run" in _failure(report)
    [f] = [c.find("failure") for c in ET.parse(xml).getroot().iter("testcase") if c.find("failure") is not None]
    assert f.get("type") == "kernel-completes" and phrase in f.get("message")
    page = html.read_text()
    assert phrase in page and "not run" in page


def test_hanging_kernel_is_bounded_by_kernel_timeout(capsys, tmp_path):
    code, text, report = _run(capsys, tmp_path, f"{K}/hostile.py:hang", "--kernel-timeout", "3")
    assert code == 1
    assert "kernel exceeded 3 s (worker killed) on rank 0" in _failure(report)
    assert "kernel exceeded 3 s" in text


def test_out_of_bounds_triton_store_crashes_the_worker_not_cpsim(capsys, tmp_path):
    code, text, report = _run(capsys, tmp_path, f"{K}/wild_store_v1.py:_compute_slot_mapping_kernel")
    assert code == 1
    assert "kernel crashed with SIGSEGV on rank 0" in _failure(report)


def test_one_entry_past_max_num_tokens_breaks_the_guard(capsys, tmp_path):
    code, text, report = _run(capsys, tmp_path, f"{K}/overrun_v1.py:_compute_slot_mapping_kernel")
    assert code == 1
    fails = {v["invariant"] for v in report["verdicts"] if v["status"] == "fail"}
    assert fails == {"guard-intact"}  # the overrun is invisible to every other invariant
    [v] = [v for v in report["verdicts"] if v["invariant"] == "guard-intact"]
    assert v["count"] == 2  # one entry on each of the 2 ranks
    assert "wrote outside [0, 128)" in text and "first at index 128" in text


def test_reading_past_the_row_is_named(capsys, tmp_path):
    code, text, report = _run(capsys, tmp_path, f"{K}/next_row_v1.py:_compute_slot_mapping_kernel")
    assert code == 1
    [v] = [v for v in report["verdicts"] if v["invariant"] == "row-bounds"]
    assert v["status"] == "fail"
    assert "read outside table row" in v["violations"][0]["message"]


@pytest.mark.parametrize("name", ["sysexit", "osexit"])
def test_process_exit_code_is_never_zero(tmp_path, name):
    """The real process, as CI runs it: the exit code and the JSON on disk."""
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "cpsim", *SMALL, "--kernel-v1", f"{K}/hostile.py:{name}",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert json.loads(out.read_text())["passed"] is False


def test_bad_kernel_timeout_is_bad_input(capsys):
    assert cli.main([*SMALL, "--kernel-timeout", "0"], runner=RUNNER) == 2
    assert "--kernel-timeout" in capsys.readouterr().err


# ---- the coordinator's new checks, fed broken gathered data --------------------

def test_correct_run_has_intact_guards(world):  # noqa: F811
    fails, verdicts = judge(world)
    assert fails == set()
    ran = {(v.invariant, v.status) for v in verdicts if v.invariant in ("guard-intact", "row-bounds",
                                                                         "kernel-completes")}
    assert ran == {("guard-intact", "pass"), ("row-bounds", "pass"), ("kernel-completes", "pass")}


@pytest.mark.parametrize("column, index", [(0, -16), (15, -1), (16, "T"), (31, "T+15")])
def test_overwritten_guard_fails(world, column, index):  # noqa: F811
    g, G = broken(world)
    G.guards[1, SHARDED, column] = 5
    fails, verdicts = judge(world, g)
    assert fails == {("guard-intact", "v2")}
    T = G.slots.shape[2]
    want = {-16: -16, -1: -1, "T": T, "T+15": T + 15}[index]
    [vio] = [x for v in verdicts if v.invariant == "guard-intact" for x in v.violations]
    assert vio.ranks == [1] and vio.group == "attn" and f"first at index {want}" in vio.message


def test_slot_from_a_guard_entry_is_read_outside_table_row(world):  # noqa: F811
    s = world[0]
    g, G = broken(world)
    grp = s.groups[SHARDED]
    e = int(G.entry_sizes[2, SHARDED])
    held = (G.slots[2, SHARDED] >= 0).nonzero().flatten()
    G.slots[2, SHARDED, held[0]] = table_guard_id(grp.num_blocks, grp.block_size, e) * e + 3
    fails, verdicts = judge(world, g)
    assert ("row-bounds", "v2") in fails
    [vio] = [x for v in verdicts if v.invariant == "row-bounds" for x in v.violations]
    assert vio.ranks == [2] and "read outside table row" in vio.message


def test_kernel_failure_fails_and_leaves_the_path_unchecked(world):  # noqa: F811
    g, G = broken(world)
    G.failures = [KernelFailure("v2", 3, "crashed", "kernel crashed with SIGSEGV on rank 3")]
    fails, verdicts = judge(world, g)
    assert fails == {("kernel-completes", "v2")}
    v2 = {v.invariant: v.status for v in verdicts if v.path == "v2"}
    assert v2.pop("kernel-completes") == "fail" and set(v2.values()) == {"not run"}
    agree = [v.path for v in verdicts if v.invariant == "paths-agree"]
    assert all("v2" not in p for p in agree)  # a failed path is compared with nothing
    assert not coordinator.passed(verdicts)


def test_guards_are_intact_in_every_built_in_path(world):  # noqa: F811
    for G in world[2].values():
        assert G.guards is not None and bool((G.guards == GUARD).all())
        assert G.failures == []
        assert torch.equal(G.slots, G.slots.contiguous())


def test_kernel_file_calling_sys_exit_at_import_is_a_named_violation(capsys, tmp_path):
    f = tmp_path / "exits.py"
    f.write_text("import sys\nsys.exit(0)\n\n\ndef f(positions):\n    return positions\n")
    code, text, report = _run(capsys, tmp_path, f"{f}:f")
    assert code == 1
    assert f"called sys.exit(0) while its file {f} was imported" in _failure(report)


def test_paths_run_side_by_side_and_a_hang_in_one_leaves_the_other_checked(capsys, tmp_path, monkeypatch):
    """Two workers (one per path): v1's kernel hangs and is killed on its bound; v2 (built-in)
    runs in the other worker meanwhile and is checked in full."""
    import time
    from cpsim.run import isolation
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "2")
    out = tmp_path / "r.json"
    t = time.monotonic()
    code = cli.main(["run", "--scenario", "mtp", "--dcp", "2", "--paths", "v1,v2", "--kernel-v1",
                     f"{K}/hostile.py:hang", "--kernel-timeout", "4", "--json", str(out)], runner=RUNNER)
    took = time.monotonic() - t
    text = capsys.readouterr().out
    assert code == 1 and "Traceback" not in text
    report = json.loads(out.read_text())
    v1 = {v["invariant"]: v["status"] for v in report["verdicts"] if v["path"] == "v1"}
    v2 = {v["invariant"]: v["status"] for v in report["verdicts"] if v["path"] == "v2"}
    assert v1.pop("kernel-completes") == "fail" and set(v1.values()) == {"not run"}
    assert v2["matches-reference"] == "pass" and "not run" not in v2.values()
    assert len(RUNNER.pool) >= 2
    assert took < 120  # bounded: the hang cost its 4 s, not the test's timeout


def test_run_paths_config_error_leaves_no_stale_worker(monkeypatch):
    """An error while other paths are still running kills their workers, so no stale reply
    is read as the answer to the next request."""
    from cpsim.allocator import allocate_world
    from cpsim.errors import ConfigError
    from cpsim.paths import Knobs
    from cpsim.run import isolation
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "2")
    s = preset("mtp", dcp=2)
    allocs = allocate_world(s)
    knobs = [Knobs()] * s.cp.world
    first = RUNNER.run_paths(s, ["v1", "v2"], allocs, "cpu", knobs, {})
    assert all(isinstance(v, list) and v[0] is not None for v in first.values())
    monkeypatch.setattr(worker.Worker, "answer", lambda *a: (_ for _ in ()).throw(ConfigError("f", "r")))
    with pytest.raises(ConfigError):
        RUNNER.run_paths(s, ["v1", "v2"], allocs, "cpu", knobs, {})
    assert not RUNNER.run_ahead.inflight and all(not w.alive() for w in RUNNER.pool[:2])
    monkeypatch.undo()
    again = RUNNER.run_paths(s, ["v1", "v2"], allocs, "cpu", knobs, {})
    for p in ("v1", "v2"):
        assert all(torch.equal(a.slots, b.slots) for a, b in zip(first[p], again[p]))


def test_two_workers_name_every_failing_rank_and_only_unrun_ranks_as_not_run(capsys, tmp_path, monkeypatch):
    """Two workers split the ranks: at CP 2 rank 1 runs beside rank 0, so it is named as failing
    too, never as "not run"."""
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "2")
    code, text, report = _run(capsys, tmp_path, f"{K}/hostile.py:raises")
    assert code == 1
    msg = _failure(report)
    assert "kernel raised ValueError: boom from cp_rank 0 at " in msg and "on rank 0, group attn" in msg
    assert "also failed on rank 1 (raised)" in msg and "not run" not in msg


def test_first_failure_and_rank_ranges():
    from cpsim.run.chunks import _first_failure
    f = _first_failure([KernelFailure("v1", 4, "raised", "m4"), KernelFailure("v1", 1, "crashed", "m1")],
                       [1, 2, 3, 4, 6, 7])
    assert f.rank == 1 and f.message == "m1; also failed on rank 4 (raised)" and f.not_run == [2, 3, 6, 7]
    [v] = [v for v in coordinator.kernel_failed("v1", f, 8) if v.status == "fail"]
    assert v.violations[0].message.endswith("; ranks 2-3, 6-7 not run")


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5"])
def test_bad_kernel_workers_value_is_exit_2(capsys, value, monkeypatch):
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", value)
    code = cli.main(["run", "--scenario", "mtp", "--dcp", "2", "--paths", "v1", "--quiet"], runner=RUNNER)
    text = capsys.readouterr()
    assert code == 2 and "Traceback" not in text.out + text.err
    assert "CPSIM_KERNEL_WORKERS: must be a positive integer" in text.out + text.err


def _world(s):
    from cpsim.run import isolation
    RUNNER.forget_ahead()  # nothing an earlier test started ahead is left in flight or kept
    from cpsim.allocator import allocate_world
    from cpsim.paths import Knobs
    return allocate_world(s), [Knobs()] * s.cp.world


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for p in a:
        assert isinstance(a[p], list) and isinstance(b[p], list)
        assert all(torch.equal(x.slots, y.slots) and torch.equal(x.guard, y.guard) for x, y in zip(a[p], b[p]))


def test_runs_started_ahead_are_collected_not_run_again():
    """``ahead`` (fuzz starts the next scenario while it checks the last) hands ``run_paths`` the
    very results a plain call gives, without running the ranks a second time."""
    from cpsim.run import isolation
    s = preset("mtp", dcp=2)
    allocs, knobs = _world(s)
    plain = RUNNER.run_paths(s, ["v1", "v2"], allocs, "cpu", knobs, {})
    before = next(RUNNER.pool.tokens)
    assert RUNNER.ahead(s, ["v1", "v2"], allocs, "cpu", knobs, {})
    _same(RUNNER.run_paths(s, ["v1", "v2"], allocs, "cpu", knobs, {}), plain)
    assert next(RUNNER.pool.tokens) == before + 2  # the rank runs were started once, by ahead
    assert not RUNNER.run_ahead.inflight and not RUNNER.run_ahead.kept


def test_workers_started_ahead_are_adopted_and_one_dead_before_use_is_replaced(monkeypatch):
    """A ``HeadStart``'s children (``cpsim run`` starts them before it imports torch) are the runner's
    workers: told their device by the probe (the first answers it, the others prepare meanwhile), they
    run the paths and give what a plain call gives; one that died before it was used is replaced by a
    fresh child; all end with the runner."""
    from cpsim.run.boot import HeadStart
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "3")
    s = preset("mtp", dcp=3)
    allocs, knobs = _world(s)
    plain = RUNNER.run_paths(s, ["v1", "v2"], allocs, "cpu", knobs, {})
    ahead = HeadStart(3)
    first, second, dead = (c.proc for c in ahead.children)
    dead.kill()
    dead.wait()
    with runner.KernelRunner(Isolation(), head_start=ahead) as own:
        assert [w.device for w in own.pool] == [None, None, None] and len(own.pool.groups) == 3
        sig = own.probe(f"{HERE.parent}/examples/my_slots.py:my_slots", "v1", False, "cpu", "--kernel-v1")
        assert sig.name == "my_slots"
        assert [(w.device, w.starting) for w in own.pool] == [("cpu", False), ("cpu", True), (None, False)]
        _same(own.run_paths(s, ["v1", "v2"], allocs, "cpu", knobs, {}), plain)
        assert [w.proc for w in own.pool[:2]] == [first, second] and not own.pool[1].starting
        assert own.pool[2].alive() and own.pool[2].proc.pid != dead.pid and own.pool[2].generation == 2
        procs = [w.proc for w in own.pool]
    assert all(p.wait(10) is not None for p in procs)  # ended (a child still running: TimeoutExpired)


def test_runs_ahead_wait_for_other_runs_and_keep_their_results():
    """Another scenario needing the workers first (fuzz classifying a failure) collects the runs
    started ahead and keeps them for the call they were started for."""
    from cpsim.run import isolation
    s1, s2 = preset("mtp", dcp=2), preset("mtp", dcp=4)
    (a1, k1), (a2, k2) = _world(s1), _world(s2)
    plain1 = RUNNER.run_paths(s1, ["v1", "v2"], a1, "cpu", k1, {})
    plain2 = RUNNER.run_paths(s2, ["v1", "v2"], a2, "cpu", k2, {})
    assert RUNNER.ahead(s1, ["v1", "v2"], a1, "cpu", k1, {})
    _same(RUNNER.run_paths(s2, ["v1", "v2"], a2, "cpu", k2, {}), plain2)
    before = next(RUNNER.pool.tokens)
    _same(RUNNER.run_paths(s1, ["v1", "v2"], a1, "cpu", k1, {}), plain1)
    assert next(RUNNER.pool.tokens) == before + 1 and not RUNNER.run_ahead.kept


def test_a_worker_crashing_with_later_paths_queued_names_the_rank_and_runs_the_rest(monkeypatch):
    """Every path's chunk is sent at once: when the child dies on v1, v2's chunk (queued behind it)
    goes to a fresh child, and the failure names the rank that crashed."""
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "1")  # both ranks in one child: rank 1 is left unrun
    from cpsim.paths import KernelFailure
    from kernel_load import load
    from cpsim.run import isolation
    s = preset("mtp", dcp=2)
    allocs, knobs = _world(s)
    plain = RUNNER.run_paths(s, ["v2"], allocs, "cpu", knobs, {})
    kernels = {"v1": load(f"{K}/hostile.py:segfault", "v1")}
    assert RUNNER.ahead(s, ["v1", "v2"], allocs, "cpu", knobs, kernels)
    got = RUNNER.run_paths(s, ["v1", "v2"], allocs, "cpu", knobs, kernels)
    assert isinstance(got["v1"], KernelFailure) and got["v1"].kind == "crashed" and got["v1"].rank == 0
    assert got["v1"].not_run == [1]
    _same({"v2": got["v2"]}, plain)


def test_two_scenarios_in_flight_come_back_in_any_order_each_run_once(monkeypatch):
    """``DEPTH`` scenarios may be queued in the workers at once; each call gets its own results
    (equal to a plain call's), whichever is asked for first, and nothing runs twice."""
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "1")
    from cpsim.run import isolation
    s1, s2, s3 = preset("mtp", dcp=2), preset("mtp", dcp=4), preset("mtp", dcp=1)
    (a1, k1), (a2, k2), (a3, k3) = _world(s1), _world(s2), _world(s3)
    plain1 = RUNNER.run_paths(s1, ["v1", "v2"], a1, "cpu", k1, {})
    plain2 = RUNNER.run_paths(s2, ["v1", "v2"], a2, "cpu", k2, {})
    before = next(RUNNER.pool.tokens)
    assert RUNNER.ahead(s1, ["v1", "v2"], a1, "cpu", k1, {})
    assert RUNNER.ahead(s2, ["v1", "v2"], a2, "cpu", k2, {})
    assert isolation.DEPTH == 2 and not RUNNER.ahead(s3, ["v1", "v2"], a3, "cpu", k3, {})
    _same(RUNNER.run_paths(s2, ["v1", "v2"], a2, "cpu", k2, {}), plain2)  # the later one first
    assert len(RUNNER.run_ahead.kept) == 1 and not RUNNER.run_ahead.inflight
    _same(RUNNER.run_paths(s1, ["v1", "v2"], a1, "cpu", k1, {}), plain1)
    assert next(RUNNER.pool.tokens) == before + 3 and not RUNNER.run_ahead.kept


def test_a_crash_in_the_first_scenario_in_flight_resends_the_second_to_a_fresh_worker(monkeypatch):
    """The child dies on the first queued scenario, taking the second one's messages with it: the
    failure names the first scenario's rank, and the second runs in a fresh child, unharmed."""
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "1")
    from cpsim.paths import KernelFailure
    from kernel_load import load
    from cpsim.run import isolation
    s1, s2 = preset("mtp", dcp=2), preset("mtp", dcp=4)
    (a1, k1), (a2, k2) = _world(s1), _world(s2)
    plain2 = RUNNER.run_paths(s2, ["v1"], a2, "cpu", k2, {})
    crash = {"v1": load(f"{K}/hostile.py:segfault", "v1")}
    assert RUNNER.ahead(s1, ["v1"], a1, "cpu", k1, crash)
    assert RUNNER.ahead(s2, ["v1"], a2, "cpu", k2, {})
    got1 = RUNNER.run_paths(s1, ["v1"], a1, "cpu", k1, crash)
    assert isinstance(got1["v1"], KernelFailure) and got1["v1"].kind == "crashed" and got1["v1"].rank == 0
    assert got1["v1"].not_run == [1]
    _same(RUNNER.run_paths(s2, ["v1"], a2, "cpu", k2, {}), plain2)


def test_a_crash_in_the_second_scenario_in_flight_is_its_own(monkeypatch, tmp_path):
    """The child dies on the second queued scenario, perhaps while the first is still being collected:
    the first keeps its results, and the crash is named on the second's rank, as it happened (a
    flaky kernel: run again, it would raise instead)."""
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "1")
    flaky = tmp_path / "flaky.py"
    flaky.write_text(f"import os, signal\n\ndef segfault_once(positions):\n"
                     f"    if os.path.exists({str(tmp_path / 'crashed')!r}):\n        raise ValueError('second call')\n"
                     f"    open({str(tmp_path / 'crashed')!r}, 'w').close()\n    os.kill(os.getpid(), signal.SIGSEGV)\n")
    from cpsim.paths import KernelFailure
    from kernel_load import load
    from cpsim.run import isolation
    s1, s2 = preset("mtp", dcp=2), preset("mtp", dcp=4)
    (a1, k1), (a2, k2) = _world(s1), _world(s2)
    plain1 = RUNNER.run_paths(s1, ["v1"], a1, "cpu", k1, {})
    crash = {"v1": load(f"{flaky}:segfault_once", "v1")}
    assert RUNNER.ahead(s1, ["v1"], a1, "cpu", k1, {})
    assert RUNNER.ahead(s2, ["v1"], a2, "cpu", k2, crash)
    _same(RUNNER.run_paths(s1, ["v1"], a1, "cpu", k1, {}), plain1)
    import time
    end = time.monotonic() + 60
    while RUNNER.pool[0].alive() and time.monotonic() < end:  # dead before it is asked for
        time.sleep(0.05)
    before = next(RUNNER.pool.tokens)
    got2 = RUNNER.run_paths(s2, ["v1"], a2, "cpu", k2, crash)
    assert isinstance(got2["v1"], KernelFailure) and got2["v1"].kind == "crashed" and got2["v1"].rank == 0
    assert got2["v1"].not_run == [1, 2, 3]
    assert next(RUNNER.pool.tokens) == before + 1  # collected, not started again


def _lose_first_batch(monkeypatch, instead=None):
    """The parent sees the child die before it answers the first batched chunk (as when a kernel
    crashed it mid-chunk), or gets ``instead``; every later reply is read as usual."""
    from cpsim.run import isolation, wire
    real, lost = worker.Worker._read, []

    def read(self, *a):
        reply = real(self, *a)
        if isinstance(reply, wire.Batch) and not lost:
            lost.append(reply)
            return instead or wire.Dead()
        return reply
    monkeypatch.setattr(worker.Worker, "_read", read)
    return lost


def test_a_lost_batched_chunk_runs_again_rank_by_rank_and_the_loss_is_reported(monkeypatch):
    """cpsim's own kernels answer a chunk in one message. When the child is lost before it answers,
    nobody knows which rank did it: the ranks run again one reply each, and when every one completes
    the loss is still reported, on the chunk, never dropped."""
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "1")
    from cpsim.paths import KernelFailure
    from cpsim.run import isolation
    s = preset("mtp", dcp=2)
    allocs, knobs = _world(s)
    lost = _lose_first_batch(monkeypatch)
    got = RUNNER.run_paths(s, ["v1", "v2"], allocs, "cpu", knobs, {})
    assert lost, "the chunk was not batched"
    f = got["v1"]
    assert isinstance(f, KernelFailure) and f.kind == "exited"
    assert "on one of ranks 0-1" in f.message and "run again one rank at a time, every one completed" in f.message
    assert isinstance(got["v2"], list) and got["v2"][1] is not None  # the chunk queued behind it ran in a fresh child


def test_a_lost_batched_chunk_that_fails_again_names_the_rank(monkeypatch):
    """Run again rank by rank, the chunk fails on rank 1: that failure, with its rank, is the path's."""
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "1")
    from cpsim.paths import KernelFailure
    from cpsim.run import isolation
    s = preset("mtp", dcp=2)
    allocs, knobs = _world(s)
    _lose_first_batch(monkeypatch)
    real = worker.Worker.answer

    def answer(self, reply, path, rank, kernel):
        if type(reply).__name__ == "RankDone" and path == "v1" and rank == 1:
            raise outcome._fail("crashed", "crashed with SIGSEGV", path, rank, kernel)
        return real(self, reply, path, rank, kernel)
    monkeypatch.setattr(worker.Worker, "answer", answer)
    got = RUNNER.run_paths(s, ["v1"], allocs, "cpu", knobs, {})
    f = got["v1"]
    assert isinstance(f, KernelFailure) and f.rank == 1 and f.kind == "crashed"
    assert "on rank 1" in f.message and "every one completed" not in f.message


@pytest.mark.parametrize("dcp", [1, 2, 4])
def test_batched_replies_equal_an_in_process_run(dcp, monkeypatch):
    from cpsim.run import isolation
    s = preset("mtp", dcp=dcp)
    allocs, knobs = _world(s)
    batched = RUNNER.run_paths(s, ["v1", "v2", "v1-torch"], allocs, "cpu", knobs, {})
    monkeypatch.setattr(RUNNER, "config", Isolation(process=False))
    _same(batched, RUNNER.run_paths(s, ["v1", "v2", "v1-torch"], allocs, "cpu", knobs, {}))


def test_a_fault_found_when_a_batched_chunk_is_read_back_runs_the_ranks_again(monkeypatch):
    """A batched chunk's outputs are read back together, after all its launches: an asynchronous device
    fault surfaces there, unattributed ("lost"). The ranks run again one by one; when every one completes,
    the fault is still reported, with its text, on the chunk."""
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "1")
    from cpsim.paths import KernelFailure
    from cpsim.run import isolation
    s = preset("mtp", dcp=2)
    allocs, knobs = _world(s)
    from cpsim.run import wire
    _lose_first_batch(monkeypatch, wire.LostOnReadback("AcceleratorError",
                                                       "CUDA error: an illegal memory access was encountered"))
    got = RUNNER.run_paths(s, ["v1"], allocs, "cpu", knobs, {})
    f = got["v1"]
    assert isinstance(f, KernelFailure) and f.kind == "raised"
    assert f.message.startswith("kernel raised AcceleratorError: CUDA error: an illegal memory access was encountered "
                                "when the outputs were read back on one of ranks 0-1")
    assert f.message.endswith("every one completed")


def test_shares_cut_ranks_on_cpu_and_paths_on_an_accelerator(monkeypatch):
    from cpsim.run.chunks import _shares
    from cpsim.run.boot import pool_size
    monkeypatch.delenv("CPSIM_KERNEL_WORKERS", raising=False)
    assert (pool_size("cuda"), pool_size("cuda:1"), pool_size("npu")) == (4, 4, 1)
    paths = ["v1", "v2", "v1-torch"]
    assert _shares(paths, 5, 2, "cpu") == [[(p, [0, 1, 2]) for p in paths], [(p, [3, 4]) for p in paths]]
    assert _shares(paths, 1, 2, "cpu") == [[(p, [0]) for p in paths]]
    assert _shares(paths, 4, 2, "cuda") == [[("v1", [0, 1, 2, 3]), ("v1-torch", [0, 1, 2, 3])],
                                            [("v2", [0, 1, 2, 3])]]
    assert _shares(["v1"], 4, 2, "cuda:0") == [[("v1", [0, 1])], [("v1", [2, 3])]]  # a worker to spare
    assert _shares(paths, 2, 1, "npu") == [[(p, [0, 1]) for p in paths]]
    assert _shares(["v1", "v2"], 5, 4, "cuda") == [[("v1", [0, 1, 2])], [("v1", [3, 4])],
                                                   [("v2", [0, 1, 2])], [("v2", [3, 4])]]
    assert _shares(["v1", "v2"], 1, 4, "cuda") == [[("v1", [0])], [("v2", [0])]]


@pytest.mark.parametrize("dcp, workers", [(1, 2), (4, 2), (4, 6)])
def test_paths_shared_out_between_workers_equal_an_in_process_run(dcp, workers, monkeypatch):
    """The accelerator's way of sharing a scenario (each worker whole paths, or a path's ranks cut
    between spare workers), run here on CPU: the results are a single process's, and a crash on one
    path's worker leaves the other path's intact."""
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", str(workers))
    from cpsim.paths import KernelFailure
    from kernel_load import load
    from cpsim.run import isolation
    real = chunks._shares
    monkeypatch.setattr(chunks, "_shares", lambda paths, world, size, device: real(paths, world, size, "cuda"))
    s = preset("mtp", dcp=dcp)
    allocs, knobs = _world(s)
    sent = []
    real_send = chunks._send
    monkeypatch.setattr(chunks, "_send", lambda run, w, tasks: sent.append((w, [t[0] for t in tasks]))
                        or real_send(run, w, tasks))
    split = RUNNER.run_paths(s, ["v1", "v2", "v1-torch"], allocs, "cpu", knobs, {})
    if workers == 2:
        assert len({w for w, _ in sent}) == 2 and sorted(p for _, ps in sent for p in ps) == ["v1", "v1-torch", "v2"]
    else:  # three paths of four ranks, two workers each
        assert len({w for w, _ in sent}) == 6 and sorted(p for _, ps in sent for p in ps) == \
            ["v1", "v1", "v1-torch", "v1-torch", "v2", "v2"]
    kernels = {"v1": load(f"{K}/hostile.py:segfault", "v1")}
    crashed = RUNNER.run_paths(s, ["v1", "v2"], allocs, "cpu", knobs, kernels)
    monkeypatch.setattr(RUNNER, "config", Isolation(process=False))
    _same(split, RUNNER.run_paths(s, ["v1", "v2", "v1-torch"], allocs, "cpu", knobs, {}))
    assert isinstance(crashed["v1"], KernelFailure) and crashed["v1"].kind == "crashed" and crashed["v1"].rank == 0
    if workers == 2:
        assert crashed["v1"].not_run == list(range(1, dcp))
    else:  # ranks 0-1 and 2-3 in two workers: the first rank of each crashes
        assert crashed["v1"].not_run == [1, 3] and "also failed on rank 2 (crashed)" in crashed["v1"].message
    _same({"v2": crashed["v2"]}, {"v2": split["v2"]})


def test_a_worker_killed_mid_batch_runs_its_ranks_again_one_by_one(monkeypatch):
    """A real SIGKILL of the worker right after it was sent a batched chunk of cpsim's own kernels (as
    the OOM killer would): nobody knows which rank it was on, so the chunk's ranks run again in a fresh
    worker, one reply each; all complete, so the loss is reported on the chunk, never dropped, and the
    path queued behind it is judged as usual."""
    import signal
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "1")
    from cpsim.paths import KernelFailure
    from cpsim.run import isolation
    s = preset("mtp", dcp=2)
    allocs, knobs = _world(s)
    real, killed = chunks._send, []

    def send(run, w, tasks):
        real(run, w, tasks)
        if not killed and run.queues[w] and run.queues[w][0][2]:  # the first batched chunk is on its way
            killed.append(w.proc.pid)
            os.kill(w.proc.pid, signal.SIGKILL)
    monkeypatch.setattr(chunks, "_send", send)
    got = RUNNER.run_paths(s, ["v1", "v2"], allocs, "cpu", knobs, {})
    assert killed
    f = got["v1"]
    assert isinstance(f, KernelFailure) and f.kind == "crashed" and "SIGKILL" in f.message
    assert "on one of ranks 0-1" in f.message and "run again one rank at a time, every one completed" in f.message
    assert isinstance(got["v2"], list) and all(o is not None for o in got["v2"])


@pytest.mark.parametrize("deadly, named, also", [((1,), 1, ""), ((1, 3), 1, "also failed on rank 3 (crashed)")])
def test_a_kernel_killing_its_worker_is_named_on_its_rank_and_the_other_ranks_run(monkeypatch, tmp_path, deadly,
                                                                                   named, also):
    """A user's kernel answers rank by rank: a worker SIGKILLed on rank 1 names rank 1 exactly (not a
    chunk), and every other rank still runs, in the other worker, and is judged on its own (rank 3 dying
    too is named as well; ranks 0 and 2 complete)."""
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "2")
    from test_hostile_kernel import callable_kernel
    kernel = tmp_path / "kills.py"
    kernel.write_text(callable_kernel(f'''
        import os, signal
        if cp_rank in {deadly!r}:
            os.kill(os.getpid(), signal.SIGKILL)
        return out'''))
    from cpsim.paths import KernelFailure
    from kernel_load import load
    from cpsim.run import isolation
    s = preset("mtp", dcp=4)
    allocs, knobs = _world(s)
    got = RUNNER.run_paths(s, ["v1"], allocs, "cpu", knobs, {"v1": load(f"{kernel}:kernel", "v1")})
    f = got["v1"]
    assert isinstance(f, KernelFailure) and f.rank == named and f.kind == "crashed"
    assert f"kernel crashed with SIGKILL on rank {named} " in f.message and "one of ranks" not in f.message
    assert (also in f.message) if also else "also failed" not in f.message
    assert f.not_run == []  # ranks 0 and 2 (and 3) ran: none is left unjudged


# ---- reaping (cpsim.run.reaper): nothing a kernel forks outlives its worker -----------------------

def _forks():
    """tests/kernels/forks_setsid.py, imported by path (its pid-file helpers)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("forks_setsid", K / "forks_setsid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TREE = '''
import os, sys, time
sys.path.insert(0, {kernels!r})
from cpsim.run import reaper
import forks_setsid
if {subreaper!r}:
    reaper.become_subreaper()
forks_setsid.sleeper("daemon", double=True)       # setsid + double fork: orphaned at once
forks_setsid.sleeper("setsid_child", double=False)  # setsid, still this process's child
print("ready", flush=True)
time.sleep(300)
'''


@pytest.mark.parametrize("subreaper", [True, False])
def test_end_trees_ends_children_in_sessions_of_their_own(tmp_path, subreaper):
    """A root that is a subreaper keeps its double-forked daemon below it, so ending its tree ends
    both sleepers; without the subreaper the daemon was re-parented to init, and only the marker sweep
    can find it (the sleeper still below the root is ended either way)."""
    import signal
    from cpsim.run import reaper
    fk = _forks()
    pids_file = tmp_path / "pids"
    root = subprocess.Popen([sys.executable, "-c", TREE.format(kernels=str(K), subreaper=subreaper)],
                            env=dict(os.environ, CPSIM_TEST_PIDS=str(pids_file)), stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert root.stdout.readline().strip() == "ready"
        daemon, child = fk.pids(pids_file, "daemon"), fk.pids(pids_file, "setsid_child")
        assert len(daemon) == len(child) == 1 and fk.alive(daemon[0]) and fk.alive(child[0])
        signalled = reaper.end_trees([root.pid])
        assert root.wait(5) == -signal.SIGKILL
        time.sleep(0.2)  # SIGKILL is delivered asynchronously
        assert not fk.alive(child[0]) and child[0] in signalled
        assert fk.alive(daemon[0]) is not subreaper and (daemon[0] in signalled) is subreaper
    finally:
        for pid in fk.pids(pids_file) + [root.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        root.wait(5)


def test_sweep_ends_the_marked_processes_only(tmp_path):
    """The sweep ends processes whose environment holds the pool's worker marker (an orphan of a
    dead worker, say), and nothing else: not one with another pool's token, not one spared (a live
    worker), not the pool's own workers."""
    import signal
    from cpsim.run import isolation, reaper

    def sleeper(value: str) -> subprocess.Popen:
        env = dict(os.environ, **{reaper.SESSION_VAR: value})
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env,
                                start_new_session=True)
    marker = RUNNER.pool.marker
    mine, other, spared = sleeper(marker.token()), sleeper("0123456789abcdef"), sleeper(marker.token())
    procs = [mine, other, spared]
    try:
        end = time.monotonic() + 30  # the environ is readable once the interpreter has been exec'd
        while time.monotonic() < end and not all(
                reaper.SESSION_VAR.encode() in Path(f"/proc/{p.pid}/environ").read_bytes() for p in procs):
            time.sleep(0.05)
        live = [w.proc.pid for w in RUNNER.pool if w.alive()]
        found = marker.sweep(spare=reaper.tree(live) | {spared.pid})
        assert found == [mine.pid]
        assert mine.wait(5) == -signal.SIGKILL
        assert other.poll() is None and spared.poll() is None
        assert all(w.alive() for w in RUNNER.pool if w.proc is not None and w.proc.pid in live)
    finally:
        for p in procs:
            p.kill()
            p.wait(5)


@pytest.mark.parametrize("sizes", [[0], [5, 7], [3, 16385], [70000, 2], [1, 2, 3, 4], [65530, 10]])
def test_messages_written_together_read_back_one_by_one(sizes):
    """``chunks._send_frames`` writes a scenario and its run in one system call; the worker's
    ``Connection.recv_bytes`` must still read each message whole, in order, small or large."""
    import socket
    from multiprocessing.connection import Connection
    from cpsim.run import isolation
    a, b = socket.socketpair()
    here, there = Connection(a.detach()), Connection(b.detach())
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    import threading
    sender = threading.Thread(target=chunks._send_frames, args=(here, payloads))
    sender.start()  # a write past the socket's buffer blocks until the reader drains it
    got = [there.recv_bytes() for _ in payloads]
    sender.join(10)
    assert got == payloads
    here.close()
    with pytest.raises(EOFError):  # the end comes next: nothing but the messages was written
        there.recv_bytes()


def test_a_reply_cut_off_by_the_worker_s_death_reads_as_its_death_not_a_wait():
    """The worker died mid-reply and a process its kernel forked still holds the pipe open: the parent
    reads what is there (a length header promising more) and calls it the death, without waiting."""
    import socket
    import struct
    import subprocess
    import threading
    from multiprocessing.connection import Connection

    from cpsim.run.worker import Worker

    here, there = socket.socketpair()
    w = Worker()
    w.conn = Connection(here.detach())
    w.proc = subprocess.Popen([sys.executable, "-c", "pass"])
    w.proc.wait()
    there.sendall(struct.pack("!i", 1000) + b"x" * 10)  # 10 of the 1000 bytes promised; `there` stays open
    got = []
    reader = threading.Thread(target=lambda: got.append(w._read()), daemon=True)
    reader.start()
    reader.join(10)
    answered = list(got)
    there.close()  # ends a reader still waiting (the failure this guards against)
    assert [type(a).__name__ for a in answered] == ["Dead"]


@pytest.mark.parametrize("fn, kind", [("raises", "raised"), ("sysexit", "exited")])
def test_a_kernel_s_exception_is_named_alike_in_a_worker_and_in_process(fn, kind, monkeypatch):
    """One mapping (``cpsim.run.outcome.kernel_error`` / ``failed``) names what a kernel raised, whether
    the worker sent it back or the in-process fallback caught it: the failures are the same."""
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "1")
    from kernel_load import load
    s = preset("mtp", dcp=2)
    allocs, knobs = _world(s)
    kernels = {"v1": load(f"{K}/hostile.py:{fn}", "v1")}
    isolated = RUNNER.run_paths(s, ["v1"], allocs, "cpu", knobs, kernels)["v1"]
    monkeypatch.setattr(RUNNER, "config", Isolation(process=False))
    here = RUNNER.run_paths(s, ["v1"], allocs, "cpu", knobs, kernels)["v1"]
    assert isinstance(isolated, KernelFailure) and isolated.kind == kind
    assert (here.kind, here.rank, here.group, here.message) == (isolated.kind, isolated.rank, isolated.group,
                                                                isolated.message)

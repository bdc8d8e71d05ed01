"""The distributed runner's pieces that need no worker processes: devices, JUnit, sweep matrix, scripts."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from cpsim.cli import main
from cpsim.cmd import sweep
from cpsim.check.coordinator import Verdict, Violation
from cpsim.presets import preset
from cpsim.run.dist import select_device
from cpsim.errors import ConfigError
from cpsim import scenario as sc
from cpsim.report.junit import write_junit
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed")
def test_npu_without_torch_npu_is_a_clear_error(capsys):
    with pytest.raises(ConfigError, match="device npu requested but torch_npu is not importable"):
        select_device("npu")
    assert main(["run", "--device", "npu"], runner=RUNNER) == 2
    assert "torch_npu is not importable" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ConfigError, match="device cuda requested"):
        select_device("cuda")


def test_cpu_uses_gloo_and_the_interpreter():
    dev = select_device("cpu", local_rank=3, local_world=8)
    assert (dev.kind, dev.backend, dev.device.type) == ("cpu", "gloo", "cpu")
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_bounded_init_when_a_rank_never_arrives():
    # A world of 2 where rank 1 never starts: init must give up after --timeout, not hang.
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "cpsim", "run", "--device", "cpu", "--timeout", "3",
                           "--scenario", "mtp"], env=env, capture_output=True, text=True, timeout=60)
    err = " ".join(proc.stderr.split())  # rich wraps long lines
    assert proc.returncode == 1
    assert "did not complete within 3 s" in err and "1/2 clients joined" in err


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_junit_sweep_labels_and_skipped_cells(tmp_path):
    """A sweep labels each replica's suite and lists cells that never ran as skipped."""
    s = sc.validate(preset("mtp"))
    fail = Verdict("owner-rule", "v2", "fail", 10, [
        Violation("owner-rule", "v2", "attn", 3, "3 token(s) not stored on rank (p // 1) % 4", [2])])
    results = [(s, [Verdict("padding", "v1", "pass", 5), fail, Verdict("same-scenario", "*", "n/a")],
                "mtp cp4 [seed 1]")]
    out = tmp_path / "r.xml"
    write_junit(out, results, skipped={"long-prefill cp8": "needs 8 ranks, the job has 4"})
    root = ET.parse(out).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("4", "1", "2")
    suites = {x.get("name"): x for x in root.iter("testsuite")}
    assert set(suites) == {"cpsim.mtp cp4 [seed 1]", "cpsim.long-prefill cp8"}
    cases = {c.get("name"): c for c in root.iter("testcase")}
    failure = cases["attn::owner-rule"].find("failure")
    assert "ranks [2]" in failure.text and "not stored on rank" in failure.text
    assert cases["scenario"].find("skipped").get("message") == "needs 8 ranks, the job has 4"
    assert cases["attn::padding"].find("failure") is None


def _args(**kw) -> Namespace:
    base = dict(config=None, presets=None, cp=None, interleaves=None, paths=None, seed=None)
    return Namespace(**(base | kw))


def test_sweep_matrix_from_toml_with_flags_winning(tmp_path):
    conf = tmp_path / "m.toml"
    conf.write_text('presets = ["mtp", "default"]\ncp = [2, "2x2"]\ninterleaves = [1]\npaths = ["v1"]\n')
    m = sweep.load_matrix(_args(config=str(conf), paths="v1,v2"))
    assert m["paths"] == ["v1", "v2"] and m["cp"] == [(2, 1), (2, 2)]
    labels = [c.label for c in sweep.cells(m)]
    assert labels == ["mtp cp2 i1", "mtp cp2x2 i1", "default cp2 i1", "default cp2x2 i1"]
    entries, skipped = sweep.plan(m, world=2)
    assert [e.label for e in entries] == ["mtp cp2 i1", "default cp2 i1"]
    assert skipped == {"mtp cp2x2 i1": "needs 4 ranks, the job has 2",
                       "default cp2x2 i1": "needs 4 ranks, the job has 2"}


@pytest.mark.parametrize("kw, field", [(dict(cp="0"), "cp"), (dict(cp="2xz"), "cp"),
                                       (dict(interleaves="a"), "interleaves"), (dict(paths="v9"), "--paths")])
def test_sweep_bad_matrix_names_the_field(kw, field):
    with pytest.raises(ConfigError) as e:
        sweep.load_matrix(_args(**kw))
    assert e.value.field == field


def test_sweep_rejects_unknown_toml_keys(tmp_path):
    conf = tmp_path / "m.toml"
    conf.write_text('presets = ["mtp"]\ncps = [2]\n')
    with pytest.raises(ConfigError, match="unknown key"):
        sweep.load_matrix(_args(config=str(conf)))


def test_virtual_sweep_writes_json_and_junit(tmp_path):
    js, xml = tmp_path / "r.json", tmp_path / "r.xml"
    code = main(["sweep", "--presets", "mtp", "--cp", "2,16", "--interleaves", "1,256", "--paths", "v1,v2",
                 "--quiet", "--json", str(js), "--junit", str(xml)], runner=RUNNER)
    assert code == 0
    root = ET.parse(xml).getroot()
    # mtp cp2 i1 runs (2 paths x 15 invariants incl. replicas-agree, replayed-is-pad, inputs-intact, kernel-output
    # + paths-agree + same-scenario);
    # i256 > B=128 is invalid;
    # cp16 i1 runs too.
    suites = {s.get("name").removeprefix("cpsim."): int(s.get("tests")) for s in root.iter("testsuite")}
    assert suites["mtp cp2 i1 [seed 0]"] == 32 and suites["mtp cp16 i1 [seed 0]"] == 32
    assert suites["mtp cp2 i256"] == 1  # skipped: invalid interleave
    import json
    data = json.loads(js.read_text())
    assert data["passed"] is True and "interleave" in data["skipped"]["mtp cp2 i256"]


@pytest.mark.parametrize("script", ["local.sh", "cpu-sim.sh", "ci-8card.sh", "multinode.sh"])
def test_launch_scripts_have_help(script):
    proc = subprocess.run([str(ROOT / "launch" / script), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: launch/" + script)


def test_launch_rejects_a_bad_nproc():
    proc = subprocess.run([str(ROOT / "launch" / "cpu-sim.sh"), "eight"], capture_output=True, text=True,
                          timeout=30, env=dict(os.environ, PY=sys.executable))
    assert proc.returncode == 2 and "NPROC must be a positive integer" in proc.stderr


# ---- HCCL timeouts from --timeout ------------------------------------------------------

def test_hccl_timeouts_follow_timeout_within_cann_ranges():
    from cpsim.run.dist import hccl_env
    # a little above --timeout so cpsim's own bound fires first; exec a multiple of 68 (HCCL rounds down)
    assert hccl_env(300, {}) == {"HCCL_CONNECT_TIMEOUT": "310", "HCCL_EXEC_TIMEOUT": "340"}
    assert hccl_env(200.5, {}) == {"HCCL_CONNECT_TIMEOUT": "211", "HCCL_EXEC_TIMEOUT": "272"}
    # clamped to what CANN accepts: connect [120, 7200], exec [68, 17340]
    assert hccl_env(5, {}) == {"HCCL_CONNECT_TIMEOUT": "120", "HCCL_EXEC_TIMEOUT": "68"}
    assert hccl_env(1e6, {}) == {"HCCL_CONNECT_TIMEOUT": "7200", "HCCL_EXEC_TIMEOUT": "17340"}


def test_hccl_timeouts_the_user_set_are_kept():
    from cpsim.run.dist import hccl_env
    assert hccl_env(300, {"HCCL_CONNECT_TIMEOUT": "600"}) == {"HCCL_EXEC_TIMEOUT": "340"}
    assert hccl_env(300, {"HCCL_CONNECT_TIMEOUT": "600", "HCCL_EXEC_TIMEOUT": "1836"}) == {}
    assert hccl_env(300, {"HCCL_EXEC_TIMEOUT": " "}) == {"HCCL_CONNECT_TIMEOUT": "310", "HCCL_EXEC_TIMEOUT": "340"}


@pytest.mark.parametrize("bad", [0, -5, float("inf"), float("nan")])
def test_timeout_must_be_positive_and_finite(bad):
    from cpsim.run.dist import check_timeout
    with pytest.raises(ConfigError) as e:
        check_timeout(bad)
    assert e.value.field == "--timeout"


def test_a_positive_timeout_is_accepted():
    from cpsim.run.dist import check_timeout
    check_timeout(0.5)
    check_timeout(300)


# ---- the launcher's one line --------------------------------------------------------------

def test_launcher_exit_code_keeps_bad_input_and_everything_else_is_1():
    from cpsim.run.launcher import Ending, exit_code
    assert exit_code([Ending(0, 2), Ending(1, 2)]) == 2
    assert exit_code([Ending(0, -15), Ending(1, 2)]) == 2  # the launcher stopped a slower rank
    assert exit_code([Ending(0, 1), Ending(1, 1)]) == 1
    assert exit_code([Ending(0, 2), Ending(1, 1)]) == 1     # one rank found more than bad input
    assert exit_code([Ending(0, -9)]) == 1
    assert exit_code([Ending(0, 0 - 15)]) == 1             # a SIGTERM alone is not bad input
    assert exit_code([Ending(0, 3)]) == 1
    assert exit_code([Ending(0, 4), Ending(1, 4)]) == 4     # no violation, a release's contract unread
    assert exit_code([Ending(0, 4), Ending(1, -15)]) == 4
    assert exit_code([Ending(0, 4), Ending(1, 1)]) == 1     # a violation on one rank outweighs it


def test_launcher_summary_names_ranks_signals_and_the_log_dir():
    from cpsim.run.launcher import Ending, summary
    line = summary([Ending(0, 1, "stopping: rank 1 died (no heartbeat)"), Ending(1, -9)], 2, "/logs")
    assert line == ("cpsim: exit 1 (a violation or a failed run, see above): rank 0 exited 1; "
                    "rank 1 stopped by SIGKILL; rank 0: stopping: rank 1 died (no heartbeat); torchrun's logs: /logs")
    line = summary([Ending(r, 2) for r in range(4)], 4, "/l")
    assert line == "cpsim: exit 2 (bad input): ranks 0-3 exited 2; torchrun's logs: /l"
    assert "\n" not in summary([Ending(0, 1, "first line\nsecond line")], 8, "/l")
    assert "rank 0 exited 1 (of 8 ranks);" in summary([Ending(0, 1)], 8, "/l")


def test_launcher_summary_quotes_rank_0s_report_for_the_job():
    from cpsim.run.launcher import Ending, _message, summary
    from types import SimpleNamespace
    line = summary([Ending(0, 1, "report: 1 of 1 CP group(s) fail; first: x"), Ending(1, 1)], 2, "/l")
    assert line == ("cpsim: exit 1 (a violation or a failed run, see above): ranks 0, 1 exited 1; "
                    "1 of 1 CP group(s) fail; first: x; torchrun's logs: /l")
    assert summary([Ending(0, 1, "report: " + "y" * 1000)], 1, "/l").endswith("yyy...; torchrun's logs: /l")
    # torch's error file holds "DistError: <message>", with or without cpsim's "[rank N] " prefix.
    for text in ("DistError: report: z", "DistError: [rank 0] report: z", "report: z"):
        f = SimpleNamespace(error_file=__file__, message={"message": text})
        assert _message(f) == "report: z"


def test_headline_names_the_first_violation_of_the_failing_groups():
    from cpsim.run.distrun import GroupResult, headline
    s = sc.validate(preset("mtp", dcp=2))
    ok = GroupResult("mtp", 0, [0, 1], s, [Verdict("padding", "v1", "pass")])
    bad = GroupResult("mtp", 1, [2, 3], s, [Verdict("padding", "v1", "pass"), Verdict(
        "kernel-completes", "v2", "fail", 2, [Violation("kernel-completes", "v2", "*", 1, "kernel raised X on rank 1", [1])])])
    assert headline([ok]) == ""
    assert headline([ok, bad]) == ("report: 1 of 2 CP group(s) fail; first: mtp CP group 1: kernel-completes [v2] "
                                   "kernel raised X on rank 1")


# ---- a failed rank run travels by collective (threads stand in for the ranks) ------------------

class _ThreadComm:
    """N ranks as threads: ``all_gather`` meets at a barrier, so ranks issuing different
    collectives would stack mismatched tensors or wait forever (bounded by the barrier)."""

    def __init__(self, n: int, shared: dict, barrier):
        self.n, self.shared, self.barrier = n, shared, barrier
        self.rank = self.shared.setdefault("next", [0])[0]
        self.shared["next"][0] += 1
        self.calls: list[str] = []

    def state(self, text: str) -> None:
        pass

    def all_gather(self, t, group=None, group_size=None, what="", ctrl=False):
        self.calls.append(what)
        self.shared[(len(self.calls), self.rank)] = t.flatten().clone()
        self.barrier.wait()
        out = torch.cat([self.shared[(len(self.calls), r)] for r in range(self.n)])
        self.barrier.wait()
        return out


def _run_group_threads(monkeypatch, fail: dict[int, str], guard_hit: int | None = None):
    """``distrun._run_group`` on CP 2 (mtp preset, paths v1 and v2) with the kernels failing on the ranks in
    ``fail`` (v1), and the guard after the row overwritten on rank ``guard_hit`` (v2)."""
    import threading

    from cpsim.paths import KernelFailure
    from cpsim.run import distrun, isolation

    s = sc.validate(preset("mtp", dcp=2))
    real, lock = RUNNER.run_rank_checked, threading.Lock()

    def run(path, s_, allocs, rank, device, knobs, kernel):
        if path == "v1" and rank in fail:
            raise isolation.KernelFailed(KernelFailure(path, rank, fail[rank], f"kernel {fail[rank]} on rank {rank}"))
        with lock:  # one rank run at a time in a process (guard watch)
            out = real(path, s_, allocs, rank, device, knobs, kernel)
        if path == "v2" and rank == guard_hit:
            out.guard[0, -1] = 5
        return out

    monkeypatch.setattr(RUNNER, "run_rank_checked", run)
    entry = distrun.Entry("mtp", lambda g: s, 2, ["v1", "v2"])
    shared, barrier = {}, threading.Barrier(2, timeout=60)
    comms = [_ThreadComm(2, shared, barrier) for _ in range(2)]
    results = [None, None]

    def rank(pos):
        results[pos] = distrun._run_group(comms[pos], None, entry, s, 0, pos, [0, 1], [s.fingerprint()] * 2,
                                          distrun.Hooks(), torch.device("cpu"), distrun.RankWork(RUNNER))

    threads = [threading.Thread(target=rank, args=(p,)) for p in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert comms[0].calls == comms[1].calls  # the same collectives, in the same order, on every rank
    assert results[1] is None
    return results[0], comms[0].calls


@pytest.mark.parametrize("fail", [{1: "raised"}, {0: "crashed", 1: "timeout"}], ids=["rank-1", "both"])
def test_a_failed_rank_run_is_gathered_as_a_kernel_completes_violation(monkeypatch, fail):
    from cpsim.check.coordinator import passed
    result, calls = _run_group_threads(monkeypatch, fail)
    assert calls == ["mtp: v1 meta", "mtp: v1 failures", "mtp: v2 meta", "mtp: v2 slots"]
    by = {(v.invariant, v.path): v for v in result.verdicts}
    first = min(fail)
    [vio] = by[("kernel-completes", "v1")].violations
    assert by[("kernel-completes", "v1")].status == "fail" and vio.ranks == sorted(fail)
    assert vio.count == len(fail)
    assert vio.message.startswith(f"kernel {fail[first]} on rank {first}")
    if len(fail) == 2:
        assert vio.message.endswith("; also failed on rank 1 (timeout)")
    assert by[("matches-reference", "v1")].status == "not run"
    # The other path ran on both ranks and was checked, its guards gathered with its slots.
    assert by[("matches-reference", "v2")].status == "pass" and by[("guard-intact", "v2")].status == "pass"
    assert not passed(result.verdicts)


def test_the_guards_travel_with_the_slots(monkeypatch):
    result, calls = _run_group_threads(monkeypatch, {})
    assert calls == ["mtp: v1 meta", "mtp: v1 slots", "mtp: v2 meta", "mtp: v2 slots"]
    statuses = {(v.invariant, v.path): v.status for v in result.verdicts}
    assert statuses[("guard-intact", "v1")] == "pass" and statuses[("kernel-completes", "v1")] == "pass"
    assert all(st != "fail" for st in statuses.values())
    broken, _ = _run_group_threads(monkeypatch, {}, guard_hit=1)
    fails = [v for v in broken.verdicts if v.status == "fail"]
    assert [(v.invariant, v.path) for v in fails] == [("guard-intact", "v2")]
    assert [x.ranks for x in fails[0].violations] == [[1]]

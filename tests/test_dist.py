"""torchrun on CPU (gloo, Triton interpreter): the distributed runner end to end.

Each test starts real worker processes through the launch scripts. They are
slow on 2 cores (every process imports torch and triton), so each one checks
as much as it can and uses small scenarios where the property allows it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpsim.check.coordinator import INVARIANTS

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
pytestmark = pytest.mark.dist


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPSIM_TEST_")}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(PY=sys.executable, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def cpu_sim(nproc: int, *args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([str(LAUNCH / "cpu-sim.sh"), str(nproc), *args], cwd=ROOT, env=env or _env(),
                          capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(*args: str, env: dict, timeout: float = 240) -> tuple[list[subprocess.CompletedProcess], float]:
    """Two torchrun invocations (2 "nodes" x 2 processes) joined by c10d rendezvous on 127.0.0.1."""
    port = free_port()
    start = time.monotonic()
    procs = [subprocess.Popen([str(LAUNCH / "multinode.sh"), "--nnodes", "2", "--nproc-per-node", "2",
                               "--rdzv-endpoint", f"127.0.0.1:{port}", "--node-rank", str(k),
                               "--rdzv-id", f"test{port}", "--", "--device", "cpu", *args],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in (0, 1)]
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return done, time.monotonic() - start


def _violations(report: dict) -> list[dict]:
    return [x for g in report["groups"] for v in g["verdicts"] for x in v["violations"]]


def test_four_ranks_default_preset(tmp_path):
    out = tmp_path / "r.json"
    proc = cpu_sim(4, "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["passed"] is True and report["world_size"] == 4
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3]
    # Per-rank phase times: every rank starts and runs kernels; only the group's first rank checks.
    times = [r["timings"] for r in report["ranks"]]
    assert all(t["startup"] > 0 and t["kernels"] > 0 and t["gather"] > 0 for t in times)
    assert times[0]["check"] > 0 and all(t["check"] == 0 for t in times[1:])
    (group,) = report["groups"]
    assert group["ranks"] == [0, 1, 2, 3] and group["scenario"]["cp"]["dcp"] == 4
    assert {v["invariant"] for v in group["verdicts"]} == set(INVARIANTS)
    assert {v["path"] for v in group["verdicts"]} >= {"v1", "v1-torch", "v2"}
    for inv in INVARIANTS:
        assert inv in proc.stdout
    assert "4 rank(s)" in proc.stdout and "all 1 CP group(s) pass" in proc.stdout


def test_eight_ranks_as_two_cp_groups_of_four(tmp_path):
    out = tmp_path / "r.json"
    proc = cpu_sim(8, "--dcp", "4", "--scenario", "mtp", "--paths", "v1,v2", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    groups = report["groups"]
    assert [g["ranks"] for g in groups] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # Each replica runs its own seed, so the two groups check different scenarios.
    assert [g["scenario"]["seed"] for g in groups] == [0, 1]
    assert groups[0]["fingerprint"] != groups[1]["fingerprint"]
    assert all(g["passed"] for g in groups)
    assert "CP group 0 (ranks 0-3)" in proc.stdout and "CP group 1 (ranks 4-7)" in proc.stdout


def test_two_nodes_through_c10d_rendezvous(tmp_path):
    out = tmp_path / "r.json"
    (a, b), _ = two_nodes("--scenario", "mtp", "--paths", "v1,v2", "--json", str(out), env=_env())
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-3000:] + b.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == 4
    (group,) = report["groups"]  # one CP group of 4 spanning both nodes
    assert group["ranks"] == [0, 1, 2, 3] and group["passed"]


def test_a_rank_that_dies_is_named_and_nobody_hangs():
    timeout = 20
    (a, b), elapsed = two_nodes("--scenario", "mtp", "--paths", "v1,v2", "--timeout", str(timeout),
                                env=_env(CPSIM_TEST_EXIT_RANK=3), timeout=timeout + 120)
    text = a.stdout + a.stderr + b.stdout + b.stderr
    assert a.returncode != 0 and b.returncode != 0, text[-3000:]
    assert elapsed < timeout + 30, f"took {elapsed:.0f} s"
    # Every surviving rank stopped through cpsim's own path and named the dead one.
    for r in (0, 1, 2):
        line = re.search(rf"^\[rank {r}\] (stopping|terminated)[^\n]*", text, re.M)
        assert line, f"rank {r} printed no stop message:\n{text[-3000:]}"
        assert "rank 3 died" in line.group(0), line.group(0)


def test_a_rank_with_another_seed_breaks_same_scenario(tmp_path):
    out = tmp_path / "r.json"
    proc = cpu_sim(2, "--scenario", "mtp", "--paths", "v1,v2", "--json", str(out),
                   env=_env(CPSIM_TEST_SEED_RANK=1))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (group,) = json.loads(out.read_text())["groups"]
    (verdict,) = group["verdicts"]  # the run stops before any path
    assert verdict["invariant"] == "same-scenario" and verdict["status"] == "fail"
    assert verdict["violations"][0]["ranks"] == [1]


def test_a_wrong_kernel_on_one_rank_is_attributed_to_it(tmp_path):
    out = tmp_path / "r.json"
    proc = cpu_sim(2, "--paths", "v1,v2", "--json", str(out), env=_env(CPSIM_TEST_FAULT_RANK=1))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    vios = _violations(json.loads(out.read_text()))
    assert vios, "the faulty kernel went unnoticed"
    assert {x["invariant"] for x in vios} >= {"padding", "matches-reference"}
    assert all(x["ranks"] == [1] for x in vios), [(x["invariant"], x["ranks"]) for x in vios]

"""torchrun on CPU (gloo, Triton interpreter): the distributed runner end to end.

Each test starts real worker processes through the launch scripts. They are
slow on 2 cores (every process imports torch and triton), so each one checks
as much as it can and uses small scenarios where the property allows it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cpsim.check.coordinator import INVARIANTS

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
pytestmark = [pytest.mark.dist, pytest.mark.e2e]


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


# ---- endings: the report survives, one line explains the exit, every rank is named -----------

SLEEPY = str(ROOT / "tests" / "kernels" / "sleepy.py") + ":slot_mapping"


def _summary(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("cpsim: exit")]


def _no_launcher_noise(text: str) -> None:
    assert "Traceback" not in text and "ChildFailedError" not in text, text[-3000:]


def test_a_violation_on_one_rank_keeps_the_report_and_ends_in_one_line(tmp_path):
    js, xml, logs = tmp_path / "r.json", tmp_path / "r.xml", tmp_path / "logs"
    proc = cpu_sim(2, "--paths", "v1", "--inject", "mamba-sized-per-cp", "--inject-on-rank", "1",
                   "--json", str(js), "--junit", str(xml), env=_env(TORCHRUN_ARGS=f"--log-dir {logs}"))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    _no_launcher_noise(text)
    assert "1 of 1 CP group(s) fail" in proc.stdout  # rank 0 printed the whole report
    report = json.loads(js.read_text())  # complete and valid
    assert report["passed"] is False and report["world_size"] == 2
    vios = _violations(report)
    assert vios and all(v["ranks"] == [1] for v in vios)
    assert {v["invariant"] for v in vios} == {"block-sizing"}
    root = ET.parse(xml).getroot()
    assert int(root.get("failures")) >= 1 and int(root.get("tests")) > 1
    (line,) = _summary(proc.stderr)
    assert line.startswith("cpsim: exit 1 (a violation") and "ranks 0, 1 exited 1" in line, line
    assert f"torchrun's logs: {logs}" in line and (logs / "torchrun.log").is_file()
    assert "ChildFailedError" in (logs / "torchrun.log").read_text()  # torchrun's own account is kept there


@pytest.mark.parametrize("nproc, args, phrase", [
    (3, ("--dcp", "2"), "world size 3 is not a multiple of the CP size 2"),
    (2, ("--interleave", "7"), "interleave 7 must divide"),
    (2, ("--timeout", "0"), "--timeout: must be greater than 0"),
    (2, ("--timeout", "-5"), "--timeout: must be greater than 0"),
    (2, ("--kernel-v1", "missing.py:f"), "--kernel-v1:"),
], ids=["world-not-multiple", "interleave", "timeout-0", "timeout-negative", "missing-kernel"])
def test_bad_input_under_torchrun_ends_every_rank_with_2(tmp_path, nproc, args, phrase):
    proc = cpu_sim(nproc, "--scenario", "mtp", *args, env=_env(TORCHRUN_ARGS=f"--log-dir {tmp_path}"),
                   timeout=180)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    _no_launcher_noise(text)
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and phrase in errors[0], proc.stderr  # once per launch, not once per rank
    (line,) = _summary(proc.stderr)
    every = "ranks 0-2" if nproc == 3 else "ranks 0, 1"
    assert line.startswith(f"cpsim: exit 2 (bad input): {every} exited 2;"), line


def test_a_kernel_from_an_unlisted_release_with_unread_changes_ends_every_rank_with_4(tmp_path):
    """As on the virtual world: no violation, a release the table does not list whose kernel file differs
    from the nearest listed release's (our own kernel in a vllm-0.99.0 folder), so exit 4 and the line."""
    top = tmp_path / "vllm-0.99.0"
    (top / "vllm" / "v1" / "worker" / "gpu").mkdir(parents=True)
    (top / "vllm-0.99.0.dist-info").mkdir()
    kernel = top / "vllm" / "v1" / "worker" / "gpu" / "block_table.py"
    kernel.write_text((ROOT / "tests" / "kernels" / "vllm_mrv2_032_abi.py").read_text())
    proc = cpu_sim(2, "--paths", "v2", "--kernel-v2", f"{kernel}:_compute_slot_mappings_kernel", "--quiet",
                   env=_env(TORCHRUN_ARGS=f"--log-dir {tmp_path / 'logs'}"), timeout=180)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 4, text[-3000:]
    _no_launcher_noise(text)
    assert "contract (v2): vLLM 0.99.0: judged with 0.34.0's contract; unread changes in " \
           "vllm/v1/worker/gpu/block_table.py" in proc.stdout
    (line,) = _summary(proc.stderr)
    assert line.startswith("cpsim: exit 4 (no violation, but a kernel's release has unread contract changes"), line


def test_a_bad_explicit_batch_under_torchrun_ends_every_rank_with_2(tmp_path):
    data = json.loads((ROOT / "examples" / "explicit-shuffled-positions.json").read_text())
    data["arrays"]["positons"] = data["arrays"].pop("positions")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    proc = cpu_sim(2, "replay", str(bad), env=_env(TORCHRUN_ARGS=f"--log-dir {tmp_path / 'logs'}"), timeout=180)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    _no_launcher_noise(text)
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "unknown array 'positons'; did you mean 'positions'?" in errors[0], proc.stderr
    (line,) = _summary(proc.stderr)
    assert line.startswith("cpsim: exit 2 (bad input): ranks 0, 1 exited 2;"), line


def test_a_kernel_that_returns_the_wrong_kind_under_torchrun_is_a_violation_on_every_rank(tmp_path):
    """A user kernel that loads but returns a list instead of a tensor: what a kernel returns is judged
    (kernel-output, exit 1, on the ranks where it happened), not bad input from the user."""
    f = tmp_path / "bad_callable.py"
    f.write_text("def slots(positions):\n    return positions.tolist()\n")
    proc = cpu_sim(2, "--scenario", "mtp", "--paths", "v1", "--kernel-v1", f"{f}:slots",
                   env=_env(TORCHRUN_ARGS=f"--log-dir {tmp_path / 'logs'}"), timeout=180)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    _no_launcher_noise(text)
    assert "kernel-output [v1] group attn ranks [0]" in text and "kernel-output [v1] group attn ranks [1]" in text
    assert "returns a 1-D integer tensor" in text


def _rank_process(pid: int) -> int:
    """The cpsim rank that runs ``pid``: the ancestor whose parent is the launcher."""
    def cmdline(p):
        return Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()

    def parent(p):
        return int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])

    while "cpsim.run.launcher" not in cmdline(parent(pid)):
        pid = parent(pid)
        assert pid > 1, "the kernel does not run under the launcher"
    return pid


@pytest.mark.parametrize("sig, named", [(signal.SIGTERM, "rank 1 terminated: SIGTERM while"),
                                        (signal.SIGKILL, "rank 1 died (no heartbeat")], ids=["SIGTERM", "SIGKILL"])
def test_a_rank_killed_mid_run_is_named_within_the_timeout(tmp_path, sig, named):
    timeout, pid_file = 20, tmp_path / "pid"
    proc = subprocess.Popen([str(LAUNCH / "cpu-sim.sh"), "2", "--scenario", "mtp", "--paths", "v1",
                             "--kernel-v1", SLEEPY, "--kernel-abi", "callable", "--timeout", str(timeout)],
                            cwd=ROOT, env=_env(CPSIM_TEST_PID_FILE=pid_file, TORCHRUN_ARGS=f"--log-dir {tmp_path}"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (pid_file.exists() and pid_file.read_text()) and proc.poll() is None:
            assert time.monotonic() < deadline, "rank 1 never reached its kernel"
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        os.kill(_rank_process(int(pid_file.read_text())), sig)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=timeout + 60)
        elapsed = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out + err
    assert proc.returncode == 1, text[-3000:]
    assert elapsed < timeout, f"took {elapsed:.0f} s after the kill"
    _no_launcher_noise(text)
    line = re.search(r"^\[rank 0\] (stopping|terminated)[^\n]*", text, re.M)
    assert line and named in line.group(0), text[-3000:]
    (summary,) = _summary(err)
    assert "rank 1" in summary, summary


def test_a_slow_rank_is_named_with_its_heartbeat_alive(tmp_path):
    timeout = 10
    start = time.monotonic()
    # The kernel's own bound (--kernel-timeout) is set past the sleep, so that the rank stays
    # alive and slow, and the collective's bound is what names it.
    proc = cpu_sim(2, "--scenario", "mtp", "--paths", "v1", "--kernel-v1", SLEEPY, "--kernel-abi", "callable",
                   "--timeout", str(timeout), "--kernel-timeout", "600",
                   env=_env(CPSIM_TEST_SLEEP_S=300, TORCHRUN_ARGS=f"--log-dir {tmp_path}"), timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    assert time.monotonic() - start < 200  # nobody waited for the 300 s sleep
    _no_launcher_noise(text)
    line = re.search(r"^\[rank 0\] stopping: [^\n]*", text, re.M)
    assert line, text[-3000:]
    assert re.search(rf"rank 1 did not reach mtp: v1 meta within {timeout} s; its heartbeat is alive",
                     line.group(0)), line.group(0)
    assert re.search(r"^\[rank 1\] terminated by SIGTERM: rank 0 aborted: rank 1 did not reach", text, re.M), text


def test_a_rank_dead_before_its_group_warm_up_is_named(tmp_path):
    timeout = 20
    (a, b), elapsed = two_nodes("--scenario", "mtp", "--paths", "v1", "--dcp", "2", "--timeout", str(timeout),
                                env=_env(CPSIM_TEST_WARMUP_EXIT_RANK=3, TORCHRUN_ARGS=f"--log-dir {tmp_path}"),
                                timeout=timeout + 150)
    text = a.stdout + a.stderr + b.stdout + b.stderr
    assert a.returncode != 0 and b.returncode != 0, text[-3000:]
    assert elapsed < timeout + 60, f"took {elapsed:.0f} s"
    # Rank 2 shares CP group 1 with rank 3: its warm-up names rank 3; ranks 0 and 1 name it at the next exchange.
    for r in (0, 1, 2):
        line = re.search(rf"^\[rank {r}\] (stopping|terminated)[^\n]*", text, re.M)
        assert line and "rank 3" in line.group(0), f"rank {r}:\n{text[-3000:]}"
    assert "CPSIM_TEST_WARMUP_EXIT_RANK" in text


# ---- a kernel that fails on a rank: a violation in the report, not a lost run ------------------

K = ROOT / "tests" / "kernels"


@pytest.mark.parametrize("spec, abi, extra, invariant, phrase", [
    (f"{K}/hostile.py:raises", "callable", {}, "kernel-completes",
     "kernel raised ValueError: boom from cp_rank 0 at"),  # then the kernel's file:line and source line
    (f"{K}/hostile.py:segfault", "callable", {}, "kernel-completes", "kernel crashed with SIGSEGV on rank 0"),
    (f"{K}/hostile.py:sysexit", "callable", {}, "kernel-completes", "kernel called sys.exit(0) on rank 0"),
    (f"{K}/hostile.py:osexit", "callable", {}, "kernel-completes", "kernel ended its process with exit code 0"),
    # Rank 1 only, bounded by the default kernel bound under torchrun (3/4 of --timeout 20).
    (SLEEPY, "callable", {"CPSIM_TEST_SLEEP_S": 600}, "kernel-completes",
     "kernel exceeded 15 s (worker killed) on rank 1"),
    (f"{K}/overrun_v1.py:_compute_slot_mapping_kernel", "auto", {}, "guard-intact",
     "rank 1: 1 guard entr(ies) around the slot buffer overwritten: the kernel wrote outside [0, 128)"),
], ids=["raises", "segfault", "sysexit", "osexit", "hang-on-rank-1", "guard"])
def test_a_failing_kernel_is_reported_by_rank_0_with_every_output(tmp_path, spec, abi, extra, invariant, phrase):
    js, xml, html = tmp_path / "r.json", tmp_path / "r.xml", tmp_path / "r.html"
    proc = cpu_sim(2, "--scenario", "mtp", "--paths", "v1", "--kernel-v1", spec, "--kernel-abi", abi,
                   "--timeout", "20", "--json", str(js), "--junit", str(xml), "--html", str(html),
                   env=_env(TORCHRUN_ARGS=f"--log-dir {tmp_path / 'logs'}", **extra))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    _no_launcher_noise(text)
    assert "1 of 1 CP group(s) fail" in proc.stdout and phrase in " ".join(proc.stdout.split())
    report = json.loads(js.read_text())
    assert report["passed"] is False and report["world_size"] == 2 and len(report["ranks"]) == 2
    (group,) = report["groups"]
    fails = [v for v in group["verdicts"] if v["status"] == "fail"]
    assert {v["invariant"] for v in fails} == {invariant}, fails
    messages = [x["message"] for v in fails for x in v["violations"]]
    assert any(phrase in m for m in messages), messages
    if invariant == "kernel-completes":  # the failed path is reported unchecked, as in the virtual world
        assert all(f"[v1: {spec}]" in m for m in messages), messages
        [vio] = [x for v in fails for x in v["violations"]]
        assert vio["ranks"] == ([1] if "on rank 1" in phrase else [0, 1])  # every rank whose kernel failed
        rest = {v["status"] for v in group["verdicts"] if v["path"] == "v1" and v["invariant"] != invariant}
        assert rest == {"not run"}
    failures = [f for f in ET.parse(xml).getroot().iter("failure")]
    assert failures and {f.get("type") for f in failures} == {invariant}
    assert any(phrase in f.get("message") + (f.text or "") for f in failures)
    assert phrase in html.read_text()
    (line,) = _summary(proc.stderr)  # every rank exits 1; the line quotes the first violation
    assert line.startswith("cpsim: exit 1 (a violation") and "ranks 0, 1 exited 1" in line, line
    assert f"{invariant} [v1]" in line, line


def test_a_rank_sigkilled_by_its_kernel_leaves_rank_0_report_naming_it(tmp_path):
    """Rank 1's kernel SIGKILLs rank 1's process: torchrun SIGTERMs rank 0 at once and SIGKILLs it 30 s
    later. Within that grace rank 0 writes --json / --junit / --html saying the run stopped and naming
    rank 1, and the job ends 1 in cpsim's one line."""
    js, xml, html = tmp_path / "r.json", tmp_path / "r.xml", tmp_path / "r.html"
    start = time.monotonic()
    proc = cpu_sim(2, "--scenario", "mtp", "--paths", "v1", "--kernel-v1", f"{K}/kills_rank.py:slot_mapping",
                   "--kernel-abi", "callable", "--timeout", "20", "--json", str(js), "--junit", str(xml),
                   "--html", str(html), env=_env(TORCHRUN_ARGS=f"--log-dir {tmp_path / 'logs'}"), timeout=180)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    _no_launcher_noise(text)
    assert time.monotonic() - start < 120
    report = json.loads(js.read_text())
    assert report["passed"] is False and report["world_size"] == 2
    stopped = report["stopped"]
    assert stopped["ranks"] == [1], stopped
    assert "rank 1 died (no heartbeat" in stopped["message"], stopped
    assert stopped["entries_done"] == 0 and stopped["entries_planned"] == 1 and report["groups"] == []
    errors = list(ET.parse(xml).getroot().iter("error"))
    assert len(errors) == 1 and "rank 1 died" in errors[0].get("message"), [e.attrib for e in errors]
    assert int(ET.parse(xml).getroot().get("errors")) == 1
    page = html.read_text()
    assert "the run stopped before the end" in page and "rank 1 died" in page
    assert re.search(r"^\[rank 0\] the run stopped early; .*r\.json.* \(rank 1 named\)", proc.stderr, re.M), text
    (summary,) = _summary(proc.stderr)
    assert summary.startswith("cpsim: exit 1") and "rank 1" in summary, summary


def test_a_rank_sigkilled_in_a_torchrun_sweep_leaves_rank_0_report_naming_it(tmp_path):
    """The same death in `sweep` (two cells, the first call on rank 1 kills it): rank 0's --json /
    --junit / --html say the sweep stopped, name rank 1, and count the cells planned, none done."""
    js, xml, html = tmp_path / "r.json", tmp_path / "r.xml", tmp_path / "r.html"
    start = time.monotonic()
    proc = cpu_sim(2, "sweep", "--presets", "mtp,default", "--cp", "2", "--paths", "v1",
                   "--kernel-v1", f"{K}/kills_rank.py:slot_mapping", "--kernel-abi", "callable", "--timeout", "20",
                   "--json", str(js), "--junit", str(xml), "--html", str(html), "--quiet",
                   env=_env(TORCHRUN_ARGS=f"--log-dir {tmp_path / 'logs'}"), timeout=180)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    _no_launcher_noise(text)
    assert time.monotonic() - start < 120
    report = json.loads(js.read_text())
    assert report["passed"] is False and report["world_size"] == 2 and report["mode"] == "sweep-torchrun", report
    stopped = report["stopped"]
    assert stopped["ranks"] == [1] and "rank 1 died (no heartbeat" in stopped["message"], stopped
    assert stopped["entries_done"] == 0 and stopped["entries_planned"] == 2 and report["groups"] == [], stopped
    errors = list(ET.parse(xml).getroot().iter("error"))
    assert len(errors) == 1 and "rank 1 died" in errors[0].get("message"), [e.attrib for e in errors]
    page = html.read_text()
    assert "the run stopped before the end" in page and "rank 1 died" in page
    assert re.search(r"^\[rank 0\] the run stopped early; .*r\.json.* \(rank 1 named\)", proc.stderr, re.M), text
    (summary,) = _summary(proc.stderr)
    assert summary.startswith("cpsim: exit 1") and "rank 1" in summary, summary

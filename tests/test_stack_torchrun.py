"""cpsim run --stack under torchrun: each rank's driver child joins the runtime's own process groups
and drives the host objects of the DCP rank they give it; rank 0 judges every CP group.

Host classes of our own in vllm-ascend's shape (tests/stack_hosts) bring their own gloo groups
(``init_distributed``), so these run without vLLM; the row on vLLM's real classes and groups skips
unless the side environment of scripts/upstream_install.py is there (make upstream-check runs the
same check on every stop: its torchrun rows).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_dist import _env, cpu_sim

ROOT = Path(__file__).resolve().parents[1]
HOSTS = ROOT / "tests" / "stack_hosts"
UPSTREAM = ROOT / ".venv-upstream"
pytestmark = [pytest.mark.dist, pytest.mark.e2e]


def own(name_or_path) -> list[str]:
    path = name_or_path if isinstance(name_or_path, Path) else HOSTS / f"{name_or_path}.py"
    return ["--stack", "vllm-ascend", "--paths", "v1", "--stack-python", sys.executable, "--stack-classes", str(path)]


def failing(report: dict) -> set[str]:
    return {v["invariant"] for v in report["verdicts"] if v["status"] == "fail"}


def test_tp_larger_than_dcp_judges_each_cp_group_and_a_tp_rank_bug_fails_the_second(tmp_path):
    """World 4, DCP 2 (TP 4): two DCP groups, each DCP rank held by two TP ranks. Correct classes pass
    on both groups, each rank placed by the groups at its DCP rank; classes that read their DCP rank
    from the TP group agree with DCP on ranks 0-1 only, so the second group fails and the first passes."""
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    proc = cpu_sim(4, "--dcp", "2", *own("ascend_shape"), "--timeout", "60", "--quiet", "--json", str(good))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rep = json.loads(good.read_text())
    assert rep["passed"] and rep["stack"]["torchrun_world"] == 4 and len(rep["cp_groups"]) == 2
    placed = [[(r["rank"], r["dcp_rank"]) for r in g["torchrun"]["ranks"]] for g in rep["cp_groups"]]
    assert placed == [[(0, 0), (1, 1)], [(2, 0), (3, 1)]]
    assert all(not failing(g) for g in rep["cp_groups"])
    assert "the classes file's own init_distributed" in " ".join(rep["stack"]["patches"])
    assert not any("answered per rank" in p for p in rep["stack"]["patches"])  # nothing stood in for the groups

    xml, page = tmp_path / "bad.xml", tmp_path / "bad.html"
    proc = cpu_sim(4, "--dcp", "2", *own("tp_rank_for_dcp"), "--timeout", "60", "--quiet", "--json", str(bad),
                   "--junit", str(xml), "--html", str(page))
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    first, second = json.loads(bad.read_text())["cp_groups"]
    assert not failing(first)
    assert {"owner-rule", "exactly-one-owner"} <= failing(second)
    failed = {c.get("classname") for c in ET.parse(xml).getroot().iter("testcase") if c.find("failure") is not None}
    assert failed and all("CP group 1" in name for name in failed), failed  # every requested report, per group
    assert "CP group 0" in page.read_text() and "owner-rule" in page.read_text()


def hostile(tmp_path: Path, deed: str, on_rank: int) -> Path:
    """Our classes whose compute_slot_mapping does ``deed`` on torchrun rank ``on_rank``."""
    bad = tmp_path / "hostile.py"
    bad.write_text(f"import sys\nsys.path.insert(0, {str(HOSTS)!r})\nfrom ascend_shape import *\n"
                   "import os, time, ascend_shape, torch.distributed as dist\n"
                   "good = ascend_shape.BlockTable.compute_slot_mapping\n"
                   "def deed(self, *a):\n"
                   f"    if dist.get_rank() == {on_rank}:\n"
                   f"        {deed}\n"
                   "    return good(self, *a)\n"
                   "ascend_shape.BlockTable.compute_slot_mapping = deed\n")
    return bad


def test_host_code_that_raises_on_one_rank_is_kernel_completes_on_that_torchrun_rank(tmp_path):
    js = tmp_path / "r.json"
    proc = cpu_sim(2, "--dcp", "2", *own(hostile(tmp_path, "raise ValueError('boom')", 1)), "--timeout", "60",
                   "--quiet", "--json", str(js))
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    rep = json.loads(js.read_text())
    (kc,) = [v for v in rep["verdicts"] if v["invariant"] == "kernel-completes"]
    vio = kc["violations"][0]
    assert kc["status"] == "fail" and vio["ranks"] == [1], kc
    assert "torchrun rank 1 (DCP rank 1)" in vio["message"] and "ValueError: boom" in vio["message"], vio
    assert "Traceback" not in proc.stdout


def _drivers_under(folder: Path) -> list[int]:
    """Live processes whose command line names ``folder`` (the stack driver and its forked jobs)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(folder) in cmd and "cpsim.stack.driver" in cmd and state != "Z":
            out.append(int(pid))
    return out


def test_a_rank_whose_host_code_hangs_is_named_and_nothing_of_it_is_left(tmp_path):
    """Rank 1's host code sleeps: its job is killed at half of --timeout, while rank 0 still waits at the
    gather, so the run is judged: kernel-completes fails on rank 1 (a timeout), rank 0's --json says so,
    and nothing of rank 1's driver is left."""
    js, tmp = tmp_path / "r.json", tmp_path / "tmp"
    tmp.mkdir()
    start = time.monotonic()
    proc = cpu_sim(2, "--dcp", "2", *own(hostile(tmp_path, "time.sleep(3600)", 1)), "--timeout", "30",
                   "--quiet", "--json", str(js), env=_env(TMPDIR=tmp), timeout=240)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    assert time.monotonic() - start < 200
    rep = json.loads(js.read_text())
    (kc,) = [v for v in rep["verdicts"] if v["invariant"] == "kernel-completes"]
    vio = kc["violations"][0]
    assert kc["status"] == "fail" and vio["ranks"] == [1], kc
    assert "torchrun rank 1" in vio["message"] and "ran past 15 s" in vio["message"], vio
    deadline = time.monotonic() + 10
    while _drivers_under(tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _drivers_under(tmp) == []


def test_a_rank_that_never_reaches_the_gather_is_named_and_rank_0_writes_its_report(tmp_path):
    """Rank 1's classes hang while setting up their groups (past the gather's --timeout, inside the
    child's own bound): rank 0 names rank 1 at the gather, heartbeat alive, and its --json says the run
    stopped; torchrun then stops rank 1, whose driver child is ended as a tree."""
    bad = tmp_path / "hangs_in_init.py"
    bad.write_text(f"import sys\nsys.path.insert(0, {str(HOSTS)!r})\nfrom ascend_shape import *\n"
                   "import time, ascend_shape\n"
                   "_init = ascend_shape.init_distributed\n"
                   "def init_distributed(world_size, rank, *a):\n"
                   "    if rank == 1:\n"
                   "        time.sleep(3600)\n"
                   "    return _init(world_size, rank, *a)\n")
    js, tmp = tmp_path / "r.json", tmp_path / "tmp"
    tmp.mkdir()
    proc = cpu_sim(2, "--dcp", "2", *own(bad), "--timeout", "15", "--quiet", "--json", str(js),
                   env=_env(TMPDIR=tmp), timeout=240)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    rep = json.loads(js.read_text())
    assert rep["passed"] is False and rep["stopped"]["ranks"] == [1], rep.get("stopped")
    deadline = time.monotonic() + 10
    while _drivers_under(tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _drivers_under(tmp) == []


BASE = UPSTREAM / "base" / "bin" / "python"
VLLM_033 = UPSTREAM / "vllm-0.33.0"


@pytest.mark.skipif(not (BASE.exists() and (VLLM_033 / "vllm").is_dir()),
                    reason=f"no side environment with vLLM 0.33.0 at {BASE} + {VLLM_033} (scripts/upstream_install.py)")
def test_vllm_033_real_classes_in_vllm_own_groups_judge_as_the_virtual_world(tmp_path):
    """vLLM 0.33.0's BlockTable / BlockTables in vLLM's own process groups (TP 2, DCP 2): the same
    verdicts as the virtual world's run of the same scenario, the groups vLLM's and not stood in."""
    args = ["--stack", "vllm", "--dcp", "2", "--stack-python", str(BASE), "--stack-source", str(VLLM_033),
            "--quiet", "--timeout", "120"]
    tr, virtual = tmp_path / "tr.json", tmp_path / "v.json"
    proc = cpu_sim(2, *args, "--json", str(tr), timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    v = subprocess.run([sys.executable, "-m", "cpsim", "run", *args, "--json", str(virtual)], env=env,
                       capture_output=True, text=True, timeout=400)
    assert v.returncode == 0, v.stdout + v.stderr
    a, b = json.loads(tr.read_text()), json.loads(virtual.read_text())
    assert [(x["invariant"], x["path"], x["status"]) for x in a["verdicts"]] == \
           [(x["invariant"], x["path"], x["status"]) for x in b["verdicts"]]
    assert "vLLM's own init_distributed_environment" in " ".join(a["stack"]["patches"])
    assert not any("answered per rank" in p for p in a["stack"]["patches"])
    assert [r["dcp_rank"] for r in a["stack"]["torchrun"]["ranks"]] == [0, 1]


def test_a_scenario_the_release_cannot_express_is_exit_2_on_every_rank_in_one_line(tmp_path):
    proc = cpu_sim(2, "--dcp", "2", "--scenario", "hybrid-mamba", *own("ascend_shape"), "--timeout", "60", "--quiet")
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "groups.swa.kind" in errors[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr

"""``cpsim doctor``: the CPU table, each failure row on a fake environment, and torchrun."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from importlib import metadata as real_metadata
from pathlib import Path

import pytest

from cpsim import environment_checks
from cpsim.cli import main
from cpsim.kernels import FAULT_FP32_GATHER, FAULT_INT32_SLOT
from cpsim.run import world
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

ROOT = Path(__file__).resolve().parents[1]
TRITON_INIT = importlib.util.find_spec("triton").origin
KERNEL_NAMES = {f"kernel {p}" + ("" if p == "v1-torch" else f" {d}") for p, d, _ in environment_checks.KERNEL_CHECKS}


def rows_by_check(rows):
    return {r.check: r for r in rows}


def run_doctor(tmp_path, capsys, *args):
    out = tmp_path / "doctor.json"
    code = main(["doctor", "--device", "cpu", "--json", str(out), *args], runner=RUNNER)
    text = capsys.readouterr().out
    return code, json.loads(out.read_text()), text


# ---- a fake importlib.metadata ------------------------------------------------------

class FakeHash:
    def __init__(self, value: str):
        self.mode, self.value = value.split("=", 1)


class FakeFile:
    def __init__(self, rel: str, hash_: str | None):
        self.parts = tuple(rel.split("/"))
        self.hash = FakeHash(hash_) if hash_ else None


class FakeDist:
    def __init__(self, files):
        self.files = files


class FakeMetadata:
    """Installed distributions as a test says: {name: (version, requires, {relpath: record hash})}."""

    PackageNotFoundError = real_metadata.PackageNotFoundError

    def __init__(self, dists: dict):
        self.dists = dists

    def _get(self, name):
        key = name.lower().replace("_", "-")
        if key not in self.dists:
            raise self.PackageNotFoundError(name)
        return self.dists[key]

    def version(self, name):
        return self._get(name)[0]

    def requires(self, name):
        return self._get(name)[1]

    def distribution(self, name):
        return FakeDist([FakeFile(p, h) for p, h in self._get(name)[2].items()])


def record_hash(path: str) -> str:
    digest = hashlib.sha256(Path(path).read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def fake_env(monkeypatch, **dists):
    base = {"torch": (real_metadata.version("torch"), [], {})}
    base.update({k.replace("_", "-"): v for k, v in dists.items()})
    monkeypatch.setattr(environment_checks, "metadata", FakeMetadata(base))


# ---- the CPU table ----------------------------------------------------------------------

def test_cpu_table_every_kernel_exact_exit_0(tmp_path, capsys):
    code, report, text = run_doctor(tmp_path, capsys)
    assert code == 0, text
    assert report["passed"] is True and report["world_size"] == 1
    rows = {r["check"]: r for r in report["rows"]}
    assert {"python", "torch", "torch_npu", "cuda", "triton", "device", "torchrun backend",
            "$ASCEND_RT_VISIBLE_DEVICES", "$CUDA_VISIBLE_DEVICES", "$HCCL_CONNECT_TIMEOUT",
            "$HCCL_EXEC_TIMEOUT"} <= set(rows)
    assert KERNEL_NAMES <= set(rows)
    for name in KERNEL_NAMES:
        assert rows[name]["status"] == "ok" and rows[name]["detail"].startswith("exact on cpu"), rows[name]
    assert rows["device"]["detail"].startswith("cpu") and "gloo" in rows["torchrun backend"]["detail"]
    assert not [r for r in report["rows"] if r["status"] == "fail"]
    assert "all checks ok" in text and "kernel v2 tile" in text


def test_the_tiny_scenario_reaches_past_fp32_and_int32():
    """Block ids above 2^24 and slots above 2^31 occur, so an inexact kernel cannot pass."""
    from cpsim.allocator import allocate_world
    for cp in (1, 2):
        s = environment_checks.tiny_scenario(cp)
        ids = [int(b.max()) for rank in allocate_world(s) for b in rank[0].blocks if len(b)]
        assert max(ids) > 2**24
        assert max(ids) * s.groups[0].block_size > 2**31


@pytest.mark.parametrize("fault", [FAULT_FP32_GATHER, FAULT_INT32_SLOT])
def test_an_inexact_kernel_fails_its_row(fault):
    rows = rows_by_check(environment_checks.kernel_rows("cpu", fault=fault, runner=RUNNER))
    # Every Triton kernel writes a slot that fp32 block ids or int32 slot math get wrong.
    for path in ("v1", "v1-fused", "v2"):
        for design in ("per-request", "tile"):
            r = rows[f"kernel {path} {design}"]
            assert r.status == "fail" and r.detail.startswith("wrong slots on cpu"), r
            assert f"--paths {path} --kernel-design {design}" in r.fix
    assert rows["kernel v1-torch"].status == "ok"  # the torch path has no fault switches


def test_a_kernel_that_does_not_compile_is_exit_1_with_the_fix(tmp_path, capsys, monkeypatch):
    real = world.run_virtual

    def compile_error(s, paths, *a, **kw):
        if paths == ["v2"]:
            raise RuntimeError("CompilationError: at 12:8:\n    ids = tl.gather(row, idx, 0)\n")
        return real(s, paths, *a, **kw)

    monkeypatch.setattr(world, "run_virtual", compile_error)
    code, report, text = run_doctor(tmp_path, capsys)
    assert code == 1, text
    rows = {r["check"]: r for r in report["rows"]}
    for design in ("per-request", "tile"):
        r = rows[f"kernel v2 {design}"]
        assert r["status"] == "fail"
        assert "does not compile or run on cpu: RuntimeError: CompilationError: at 12:8:" in r["detail"]
        assert "cpsim run --paths v2" in r["fix"]
    assert rows["kernel v1 per-request"]["status"] == "ok"
    assert "2 problem(s)" in text


# ---- versions ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, rel", [("2.7.1.post2", (2, 7, 1)), ("2.7.1+cpu", (2, 7, 1)),
                                       ("2.10.0rc2", (2, 10, 0)), ("2.1", (2, 1, 0)), ("dev", None)])
def test_release(text, rel):
    assert environment_checks.release(text) == rel


def test_torch_and_torch_npu_mismatch_is_exit_1_with_the_fix(tmp_path, capsys, monkeypatch):
    fake_env(monkeypatch, torch=("2.13.0+cpu", [], {}), torch_npu=("2.7.1.post2", ["torch==2.7.1+cpu"], {}),
             triton=("3.6.0", [], {}))
    row = rows_by_check(environment_checks.torch_rows())["torch_npu"]
    assert row.status == "fail" and "built for torch 2.7.1, but torch is 2.13.0+cpu" in row.detail
    assert "pip install 'torch==2.7.1'" in row.fix and "torch-npu 2.13.0.*" in row.fix
    code, report, text = run_doctor(tmp_path, capsys, "--skip-kernels")
    assert code == 1
    assert {r["check"]: r for r in report["rows"]}["torch_npu"]["status"] == "fail"
    assert "torch_npu" in text


def test_matching_torch_npu_is_ok(monkeypatch):
    fake_env(monkeypatch, torch=("2.7.1+cpu", [], {}), torch_npu=("2.7.1.post2", [], {}))
    row = rows_by_check(environment_checks.torch_rows())["torch_npu"]
    assert row.status == "ok" and "matches torch 2.7.1" in row.detail


def test_triton_and_triton_ascend_both_installed_is_exit_1(tmp_path, capsys, monkeypatch):
    fake_env(monkeypatch, triton=("3.6.0", [], {"triton/__init__.py": "sha256=notthisfile"}),
             triton_ascend=("3.2.0", [], {"triton/__init__.py": "sha256=northisone"}))
    (row,) = environment_checks.triton_rows("cpu")
    assert row.status == "fail"
    assert row.detail.startswith(f"triton and triton-ascend both installed: the module `triton` comes from "
                                 f"{TRITON_INIT}")
    assert "pip uninstall -y triton triton-ascend" in row.fix
    code, _, text = run_doctor(tmp_path, capsys, "--skip-kernels")
    assert code == 1
    last = text.strip().splitlines()[-1]
    assert last.startswith("1 problem(s); fix first: triton: triton and triton-ascend both installed"), last
    assert "pip install -e '.[sim]'" in last


def test_both_installed_names_whose_files_are_on_disk(monkeypatch):
    real = record_hash(TRITON_INIT)
    # triton-ascend >= 3.2.1 depends on triton and overwrites its files: fine while its copy is on disk ...
    fake_env(monkeypatch, triton=("3.2.0", [], {"triton/__init__.py": "sha256=old"}),
             triton_ascend=("3.2.1", ["triton==3.2.0"], {"triton/__init__.py": real}))
    (row,) = environment_checks.triton_rows("npu")
    assert row.status == "warn" and "files of triton-ascend" in row.detail
    # ... but not once triton was reinstalled over it.
    fake_env(monkeypatch, triton=("3.2.0", [], {"triton/__init__.py": real}),
             triton_ascend=("3.2.1", ["triton==3.2.0"], {"triton/__init__.py": "sha256=old"}))
    (row,) = environment_checks.triton_rows("npu")
    assert row.status == "fail" and "files of triton)" in row.detail


def test_triton_must_suit_the_device(monkeypatch):
    fake_env(monkeypatch, triton=("3.6.0", [], {}))
    (row,) = environment_checks.triton_rows("npu")
    assert row.status == "fail" and f"pip install {environment_checks.TRITON_ASCEND_PIN}" in row.fix
    assert environment_checks.triton_rows("cpu")[0].status == "ok"
    fake_env(monkeypatch, triton_ascend=("3.2.0", [], {}))
    (row,) = environment_checks.triton_rows("cuda")
    assert row.status == "fail" and "upstream triton" in row.fix
    assert environment_checks.triton_rows("npu")[0].status == "ok"


def test_interpreter_on_an_accelerator_is_a_warning(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert rows_by_check(environment_checks.env_rows("cuda"))["$TRITON_INTERPRET"].status == "warn"
    assert rows_by_check(environment_checks.env_rows("cpu"))["$TRITON_INTERPRET"].status == "info"


def test_a_broken_torch_npu_is_a_row_not_a_traceback(tmp_path, capsys, monkeypatch):
    from cpsim.run import dist
    fake_env(monkeypatch, torch_npu=(real_metadata.version("torch").split("+")[0], [], {}),
             triton=("3.6.0", [], {}))

    def no_cann(*a, **kw):
        raise RuntimeError("libascendcl.so: cannot open shared object file")

    monkeypatch.setattr(dist, "select_device", no_cann)
    out = tmp_path / "d.json"
    code = main(["doctor", "--json", str(out)], runner=RUNNER)
    rows = {r["check"]: r for r in json.loads(out.read_text())["rows"]}
    assert code == 1
    # Here torch_npu is not importable at all; on a server without CANN's environment it raises on import.
    assert rows["npu"]["status"] == "fail" and rows["npu"]["detail"].startswith("import torch_npu failed")
    assert "set_env.sh" in rows["npu"]["fix"]
    assert rows["device"]["status"] == "fail" and "libascendcl.so" in rows["device"]["detail"]
    assert rows["kernels"]["status"] == "fail"


def test_a_missing_device_fails_the_device_row(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "d.json"
    code = main(["doctor", "--device", "cuda", "--skip-kernels", "--json", str(out)], runner=RUNNER)
    rows = {r["check"]: r for r in json.loads(out.read_text())["rows"]}
    assert code == 1
    assert rows["device"]["status"] == "fail" and "--device cuda" in rows["device"]["detail"]
    assert rows["cuda devices"]["status"] == "fail" and "CUDA_VISIBLE_DEVICES" in rows["cuda devices"]["fix"]


# ---- the table under torchrun ------------------------------------------------------------

def test_merge_keeps_what_differs_per_rank():
    a = [environment_checks.Row("device", "ok", "cuda:0"), environment_checks.Row("torch", "ok", "2.7.1")]
    b = [environment_checks.Row("device", "ok", "cuda:1"), environment_checks.Row("torch", "ok", "2.7.1")]
    merged = environment_checks.merge([a, b, b])
    assert [(m.row.check, m.row.detail, m.ranks) for m in merged] == [
        ("device", "cuda:0", [0]), ("device", "cuda:1", [1, 2]), ("torch", "2.7.1", [0, 1, 2])]
    assert environment_checks.rank_list([0, 1, 2, 5, 7], 8) == "0-2,5,7" and environment_checks.rank_list([0, 1], 2) == "all"


def cpu_sim_doctor(out: Path, **extra_env) -> subprocess.CompletedProcess:
    """``launch/cpu-sim.sh 2 doctor``: two ranks, gloo, bounded by --timeout and a wall-clock limit."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith("CPSIM_TEST_")}
    env.update(PY=sys.executable, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", OMP_NUM_THREADS="1", **extra_env)
    return subprocess.run([str(ROOT / "launch" / "cpu-sim.sh"), "2", "doctor", "--timeout", "60",
                           "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.dist
@pytest.mark.e2e
def test_two_ranks_under_torchrun(tmp_path):
    out = tmp_path / "d.json"
    proc = cpu_sim_doctor(out)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    assert all(r["device"] == "cpu (gloo)" for r in report["ranks"])
    rows = {r["check"]: r for r in report["rows"]}
    assert rows["all-gather"]["status"] == "ok" and rows["all-gather"]["ranks"] == [0, 1]
    assert "2 ranks over gloo" in rows["all-gather"]["detail"]
    for name in KERNEL_NAMES:
        assert rows[name]["status"] == "ok" and rows[name]["ranks"] == [0, 1], rows[name]
    # Only rank 0 prints the table.
    assert proc.stdout.count("cpsim doctor · 2 rank(s)") == 1 and "all checks ok" in proc.stdout


@pytest.mark.dist
@pytest.mark.e2e
def test_a_wrong_kernel_on_one_rank_fails_that_rank_only(tmp_path):
    out = tmp_path / "d.json"
    proc = cpu_sim_doctor(out, CPSIM_TEST_FAULT_RANK="1", CPSIM_TEST_FAULT=str(FAULT_FP32_GATHER))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["passed"] is False
    v1 = [r for r in report["rows"] if r["check"] == "kernel v1 per-request"]
    assert [(r["status"], r["ranks"]) for r in v1] == [("ok", [0]), ("fail", [1])]
    assert all(r["ranks"] == [0, 1] for r in report["rows"] if r["check"] == "kernel v1-torch")


# ---- the npu extra ----------------------------------------------------------------------

def test_npu_extra_pins_a_matching_torch_and_torch_npu_and_make_never_installs_it():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = dict(re.fullmatch(r"([\w-]+)==(\S+)", x).groups() for x in extras["npu"])
    assert set(pins) == {"torch", "torch-npu", "triton-ascend"}
    assert environment_checks.release(pins["torch"]) == environment_checks.release(pins["torch-npu"])
    assert environment_checks.TRITON_ASCEND_PIN == f"triton-ascend=={pins['triton-ascend']}"
    installs = re.findall(r'-e "\.\[([^\]]*)\]"', (ROOT / "Makefile").read_text())
    assert installs and all("npu" not in x.split(",") for x in installs)

"""``cpsim ascend-check`` tells kernels that triton-ascend compiles from kernels it rejects.

The compiling tests need the triton-ascend side venv (``make ascend-venv``; ``.ci/run``
makes it before the tests). They create it when it is missing and skip, saying why,
only when it cannot be created (no network, no python3.11).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpsim import kernels
from cpsim.ascend_check import registry, fan_out
from cpsim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TWINS = "tests/kernels/ascend_gather_twins.py"


@pytest.fixture(scope="session")
def ascend_python() -> str:
    with open(ROOT / ".venv-ascend.lock", "w") as lock:  # xdist workers: one of them builds it
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return fan_out.find_python()
        except ConfigError:
            made = subprocess.run(["make", "ascend-venv"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
            try:
                return fan_out.find_python()
            except ConfigError as e:
                tail = (made.stdout + made.stderr).strip().splitlines()[-3:]
                pytest.skip(f"the triton-ascend side venv cannot be created here ({e}; make ascend-venv: {tail})")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpsim", "ascend-check", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})


def test_int32_gather_fails_and_its_fp32_twin_passes(ascend_python):
    bad = _cli("--kernel-v1", f"{TWINS}:int32_gather_kernel", "--ascend-python", ascend_python, "--jobs", "1")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    first = next(ln for ln in bad.stdout.splitlines() if ln.startswith("FAIL"))
    assert "int32_gather_kernel" in first and "TOTAL_CP_WORLD_SIZE=" in first
    assert "frontend" in first and "but got int32" in first
    good = _cli("--kernel-v1", f"{TWINS}:fp32_gather_kernel", "--ascend-python", ascend_python, "--jobs", "1")
    assert good.returncode == 0, good.stdout + good.stderr
    declared = set(registry._v1_combos()[0]) - {"FAULT", "POS_INT32", "IS_CIRCULAR"}  # the twins' constexprs
    n = len(registry.user_combos("ascend-v1", declared))
    assert f"{n} passed, 0 failed" in good.stdout


def test_vector_of_table_pointers_fails_in_triton_adapter_opt(ascend_python):
    """The second stage runs and can fail: the CUDA tile_v2 (int64 loaded, cast to pointers) does."""
    npu = next(e for e in registry.BUILTINS if e.name == "tile_v2 (npu)")
    combo = npu.combos()[0]
    jobs = [registry.Job("cuda tile_v2", "cpsim.kernels.tile_v2:_tile_slot_mappings_kernel", npu.signature, combo),
            registry.Job(npu.name, npu.target, npu.signature, combo)]
    cuda, ascend = fan_out.run(ascend_python, jobs, "Ascend910B3", 2)
    assert not cuda.ok and cuda.stage == "triton-adapter-opt", (cuda.stage, cuda.error)
    assert ascend.ok, ascend.error


def test_builtin_kernels_pass_one_entry(ascend_python):
    res = _cli("--only", "triton_v1 fused", "--ascend-python", ascend_python, "--jobs", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(registry._v1_fused_combos())} passed, 0 failed" in res.stdout


def test_the_worker_imports_with_the_standard_library_only():
    """The side venv holds triton-ascend and pybind11 only: what the worker imports at its top (cpsim's
    errors, kernels.under_test, vllm_shim, the compiler) needs nothing else. ``-S``: no site-packages."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import cpsim.ascend_check.compile_worker"
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_missing_side_venv_is_bad_input_naming_the_fix():
    res = _cli("--ascend-python", "/nonexistent/python")
    assert res.returncode == 2
    assert "make ascend-venv" in res.stderr and "Traceback" not in res.stderr


def test_unknown_builtin_is_bad_input(ascend_python):
    res = _cli("--only", "no-such-kernel", "--ascend-python", ascend_python)
    assert res.returncode == 2 and "--only" in res.stderr


# ---- the registry matches the kernels it names (no side venv needed) ------------

def _params(target: str) -> dict[str, bool]:
    """{parameter: is constexpr} of a built-in kernel (loaded under the interpreter here)."""
    import importlib
    import inspect
    kernels.use_interpreter()
    kernels.import_triton()
    module, attr = target.split(":")
    fn = getattr(importlib.import_module(module), attr).fn
    return {n: "constexpr" in str(p.annotation) for n, p in inspect.signature(fn).parameters.items()}


@pytest.mark.parametrize("entry", registry.BUILTINS, ids=lambda e: e.name)
def test_registry_passes_every_argument_of_the_kernel(entry):
    params = _params(entry.target)
    runtime = {n for n, c in params.items() if not c}
    constexpr = {n for n, c in params.items() if c}
    assert set(entry.signature) == runtime
    for combo in entry.combos():
        assert set(combo) == constexpr, set(combo) ^ constexpr
        assert combo.get("FAULT", 0) == 0


def test_registry_covers_the_layouts_cpsim_launches():
    v1 = registry._v1_combos()
    assert {c["TOTAL_CP_WORLD_SIZE"] for c in v1} == {1, 2, 4, 8}
    assert {c["BLOCKS_PER_KV_BLOCK"] for c in v1} == {1, 2}
    assert any(c["KV_CACHE_BLOCK_SIZE"] & (c["KV_CACHE_BLOCK_SIZE"] - 1) for c in v1)  # not a power of two
    assert all(c["KV_CACHE_BLOCK_SIZE"] % c["CP_KV_CACHE_INTERLEAVE_SIZE"] == 0 for c in v1)
    assert all(c["TOTAL_CP_WORLD_SIZE"] == 1 for c in v1 if c["IS_CIRCULAR"]) and any(c["IS_CIRCULAR"] for c in v1)
    v2 = registry._tile_v2_combos()
    assert {(c["POW2"], c["POS_INT32"]) for c in v2} == {(a, b) for a in (True, False) for b in (True, False)}

"""cpsim run --stack: the runtime's host classes driven per CP rank in a child, judged by the coordinator.

Host classes of our own in vllm-ascend's shape (tests/stack_hosts) run without vLLM; the
installed-vLLM test skips unless a side venv with vLLM 0.33.0 is there.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from cpsim import cli
from cpsim.stack import host

HOSTS = Path(__file__).parent / "stack_hosts"
VLLM_PYTHON = os.environ.get(host.PYTHON_ENV, str(Path(__file__).resolve().parent.parent / ".venv-upstream" / "vllm-0.33.0" / "bin" / "python"))


def run(tmp_path, *argv) -> tuple[int, dict]:
    out = tmp_path / "r.json"
    code = cli.main(["run", "--quiet", "--json", str(out), *argv])
    return code, (json.loads(out.read_text()) if out.exists() else {})


def failing(report: dict) -> set[str]:
    return {v["invariant"] for v in report["verdicts"] if v["status"] == "fail"}


def own(name: str) -> list[str]:
    return ["--stack", "vllm-ascend", "--paths", "v1", "--stack-python", sys.executable,
            "--stack-classes", str(HOSTS / f"{name}.py")]


def test_own_classes_in_the_ascend_shape_pass(tmp_path):
    code, rep = run(tmp_path, *own("ascend_shape"))
    assert (code, failing(rep)) == (0, set())
    assert "ascend_shape (correct)" in rep["stack"]["release"]


@pytest.mark.parametrize("bug, invariants", [
    ("mamba_width_div_cp", {"block-sizing"}),           # vllm-ascend #9724
    ("no_draft_reserve", {"capacity"}),                 # vllm-ascend #14024
    ("kernel_block_in_virtual", {"dense-local", "matches-reference"}),  # vllm-ascend #10442
])
def test_each_upstream_host_bug_is_a_failing_run(tmp_path, bug, invariants):
    code, rep = run(tmp_path, *own(bug))
    assert code == 1
    assert invariants <= failing(rep)


def test_a_scenario_the_release_cannot_express_is_exit_2(tmp_path, capsys):
    code, _ = run(tmp_path, "--scenario", "hybrid-mamba", *own("ascend_shape"))
    assert code == 2
    assert "groups.swa.kind" in capsys.readouterr().err


def test_host_code_that_exits_early_is_never_a_pass(tmp_path, capsys):
    bad = tmp_path / "quits.py"
    bad.write_text(f"import sys\nsys.path.insert(0, {str(HOSTS)!r})\nfrom ascend_shape import *\n"
                   "import os, ascend_shape\n"
                   "ascend_shape.BlockTable.compute_slot_mapping = lambda *a: os._exit(0)\n")
    code = cli.main(["run", "--quiet", "--stack", "vllm-ascend", "--paths", "v1", "--stack-python", sys.executable,
                     "--stack-classes", str(bad)])
    assert code == 1
    assert "exited 0" in capsys.readouterr().out


def test_kv_manager_blocks_are_shared_by_ranks_and_never_the_null_block():
    from cpsim import scenario as sc
    s = sc.preset("default", dcp=4)
    for gi, g in enumerate(s.groups):
        per_req = host.kv_manager_blocks(s, gi)
        assert all(len(b) == 0 or b.min() >= 1 for b in per_req)
        lens = s.batch.allocated_lens()
        want = [0 if n <= 0 else (1 if g.kind == "mamba" else -(-n // (g.block_size * 4))) for n in lens]
        assert [len(b) for b in per_req] == want


# Findings on the unmodified release that are modelling mismatches of cpsim's oracle (docs/UPSTREAM.md):
# vLLM's slot buffer is max_num_batched_tokens (its scheduler budgets drafts inside it), and MRV2
# computes slots for mamba groups (MambaSpec.uses_slot_mapping).
VLLM_033_KNOWN = {("capacity", "v1"), ("capacity", "v2"), ("matches-reference", "v2")}


@pytest.mark.skipif(not Path(VLLM_PYTHON).exists(), reason=f"no side venv with vLLM 0.33.0 at {VLLM_PYTHON} "
                                                          f"(make upstream-venvs, or set {host.PYTHON_ENV})")
def test_installed_vllm_classes_hold_every_universal_invariant(tmp_path):
    code, rep = run(tmp_path, "--stack", "vllm", "--dcp", "4", "--stack-python", VLLM_PYTHON)
    assert rep["stack"]["release"] == "vllm 0.33.0"
    fails = {(v["invariant"], v["path"]) for v in rep["verdicts"] if v["status"] == "fail"}
    assert not {f for f in fails if f[0] in host.UNIVERSAL}
    assert fails == VLLM_033_KNOWN and code == 1

"""The inputs released runners hand their slot-mapping kernels (issue 37, item 4), expressible and judged.

vLLM 0.33.0 / 0.34.0's MRV2 speculator (``vllm/v1/worker/gpu/spec_decode/speculator.py``,
``_copy_request_inputs``) gives the rows of a CUDA-graph-padded batch ``idx_mapping == -1`` and keeps
their tokens; ``_compute_slot_mappings_kernel`` (``gpu/block_table.py``) never reads row -1
(``is_real_req``) and writes PAD for those tokens. A kernel without that mask reads the row above row
0: a guard row, so ``row-bounds`` names it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpsim import cli
from cpsim import scenario as sc

K = Path(__file__).parent / "kernels"
MRV2_OK = f"{K}/vllm_mrv2_032_abi.py:_compute_slot_mappings_kernel"
MRV2_DUMMY_BLIND = f"{K}/vllm_mrv2_032_dummy_blind.py:_compute_slot_mappings_kernel"


def _run(tmp_path, *args) -> tuple[int, dict]:
    out = tmp_path / "r.json"
    rc = cli.main(["run", "--quiet", "--json", str(out), *args])
    return rc, json.loads(out.read_text())


def _failed(rep: dict) -> set[str]:
    return {v["invariant"] for v in rep["verdicts"] if v["status"] == "fail"}


def test_graph_padding_preset_has_dummy_rows_with_tokens():
    s = sc.preset("graph-padding")
    dummies = [i for i, r in enumerate(s.batch.requests) if s.batch.is_dummy(i)]
    assert len(dummies) == 2 and all(s.batch.requests[i].num_tokens for i in dummies)
    assert s.batch.num_tokens_padded > s.batch.num_tokens


def test_builtin_kernels_pass_graph_padding(tmp_path):
    rc, rep = _run(tmp_path, "--scenario", "graph-padding", "--paths", "v1,v1-torch,v2")
    assert rc == 0 and rep["passed"], _failed(rep)


def test_released_mrv2_kernel_passes_graph_padding(tmp_path):
    rc, rep = _run(tmp_path, "--scenario", "graph-padding", "--paths", "v2", "--kernel-v2", MRV2_OK)
    assert rc == 0 and rep["passed"], _failed(rep)


def test_kernel_blind_to_dummy_rows_fails_graph_padding(tmp_path):
    """The twin without ``row >= 0`` maps the dummy rows' tokens through row -1 (guard ids)."""
    rc, rep = _run(tmp_path, "--scenario", "graph-padding", "--paths", "v2", "--kernel-v2", MRV2_DUMMY_BLIND)
    assert rc == 1
    assert {"row-bounds", "padding", "matches-reference"} <= _failed(rep)


def test_default_fuzz_finds_the_dummy_blind_kernel(tmp_path):
    """Within 300 examples of the default space (seed 0: after 9)."""
    rc = cli.main(["fuzz", "--paths", "v2", "--kernel-v2", MRV2_DUMMY_BLIND, "--max-examples", "300", "--seed", "0",
                   "--stop-after-first", "--out", str(tmp_path), "--quiet"])
    assert rc == 1
    (repro,) = tmp_path.glob("repro-*.json")
    data = json.loads(repro.read_text())
    s = sc.Scenario.from_dict(data["scenario"])
    assert any(r.num_tokens and s.batch.is_dummy(i) for i, r in enumerate(s.batch.requests))

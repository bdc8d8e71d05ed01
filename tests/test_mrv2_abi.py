"""The cpsim-mrv2 ABI (formerly vllm-mrv2): detection, a correct kernel in that signature, and one-line-broken copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpsim import cli, kernels
from kernel_load import load
from cpsim.plugin.testing import check_kernel
from mutants import mutant
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

kernels.use_interpreter()

ROOT = Path(__file__).parent.parent
MRV2 = f"{ROOT}/tests/kernels/vllm_mrv2_abi.py:_compute_slot_mappings_kernel"
BUILTIN = "cpsim.kernels.mrv2:_compute_slot_mappings_kernel"
MIXED = (str(ROOT / "examples/mixed-cp8.json"), str(ROOT / "examples/mixed-cp8.toml"))


@pytest.mark.parametrize("spec", [MRV2, BUILTIN], ids=["test-kernel", "builtin"])
def test_mrv2_abi_is_detected(spec):
    k = load(spec, "v2")
    assert k.abi == "cpsim-mrv2" and "is_padding" in k.params


@pytest.mark.parametrize("scenario", ("partial-replica",) + MIXED, ids=["partial-replica", "json", "toml"])
def test_correct_mrv2_kernel_passes_mixed_cp_sizes_at_cp8(scenario):
    results = check_kernel(MRV2, path="v2", scenarios=[scenario], runner=RUNNER)
    (verdicts,) = results.values()
    passed = {v.invariant for v in verdicts if v.status == "pass"}
    assert {"replicas-agree", "exactly-one-owner", "owner-rule", "padding", "matches-reference"} <= passed


@pytest.mark.parametrize("old,new,invariant", [
    ("shard = cp_rank % gcp", "shard = cp_rank", "replicas-agree"),
    ("span = bs * gcp", "span = bs * CP_SIZE", "dense-local"),
    ("gcp = tl.load(group_cp_sizes + group).to(tl.int64)",
     "gcp = tl.load(group_cp_sizes + group).to(tl.int64) * 0 + CP_SIZE", "exactly-one-owner"),
    ("slot = tl.where(ok, blk * kbs + off, PAD_ID)", "slot = tl.where(ok, blk * bs + off, PAD_ID)",
     "dense-local"),
    ("ok = mask & mine & (row >= 0) & (idx < live) & ~pad", "ok = mask & mine & (row >= 0) & (idx < live)",
     "padding"),
    ("tail = tl.load(query_start_loc + batch_idx)", "tail = tl.load(query_start_loc + batch_idx) + 8", "padding"),
], ids=["shard-rank-not-modulo", "virtual-block-world", "group-cp-ignored", "kernel-block-ignored",
        "is-padding-ignored", "stale-tail"])
def test_one_line_bug_fails_with_the_expected_invariant(tmp_path, old, new, invariant):
    with pytest.raises(AssertionError) as e:
        check_kernel(mutant(tmp_path, MRV2, old, new), path="v2", scenarios=["partial-replica"], runner=RUNNER)
    assert f"✗ {invariant} [v2]" in str(e.value)


def test_cli_run_with_mrv2_kernel_exits_0(capsys):
    rc = cli.main(["run", "--scenario", "partial-replica", "--paths", "v2", "--kernel-v2", MRV2], runner=RUNNER)
    assert rc == 0
    assert "(cpsim-mrv2)" in capsys.readouterr().out


def test_older_abi_without_is_padding_gets_a_host_mask_and_a_note():
    from cpsim.plugin.testing import load_kernel, run_one
    from cpsim.presets import preset
    k = load_kernel(f"{ROOT}/tests/kernels/vllm_v2_abi.py:_compute_slot_mappings_kernel", "v2", runner=RUNNER)
    s, verdicts = run_one(k, "v2", preset("partial-replica"), runner=RUNNER)
    assert all(v.status != "fail" for v in verdicts)
    assert any("no is_padding input" in n for n in k.notes)


ADAPTIVE = f"{ROOT}/tests/kernels/ascend_v1_fused_adaptive_abi.py:_compute_slot_mapping_fused_groups_adaptive_kernel"


def test_adaptive_fused_abi_is_detected_and_passes_at_cp1():
    assert load(ADAPTIVE, "v1-fused").abi == "ascend-v1-fused-adaptive"
    results = check_kernel(ADAPTIVE, path="v1-fused", scenarios=("hybrid-mamba", "random:4", "default"), runner=RUNNER)
    assert all(name.endswith("@cp1") for name in results)


def test_adaptive_tile_choice():
    from cpsim.paths.adapters import adaptive_tile
    assert adaptive_tile(1, 1) == 16 and adaptive_tile(40, 2) == 32 and adaptive_tile(10**6, 1) == 1024


def test_adaptive_fused_small_tile_bug_fails(tmp_path):
    file, attr = ADAPTIVE.rsplit(":", 1)
    text = Path(file).read_text()
    old = "if end - start <= SMALL_TILE_BLOCK_SIZE:"
    assert text.count(old) == 1
    bug = tmp_path / "bug_adaptive.py"
    # A long request done in one small tile: the tokens past it are never written.
    bug.write_text(text.replace(old, "if end - start <= 4 * SMALL_TILE_BLOCK_SIZE:").replace(
        "_slots(table, out, req, positions_ptr, start, end, stride, bs, circular, PAD_ID, SMALL_TILE_BLOCK_SIZE)",
        "_slots(table, out, req, positions_ptr, start, tl.minimum(end, start + SMALL_TILE_BLOCK_SIZE), stride, "
        "bs, circular, PAD_ID, SMALL_TILE_BLOCK_SIZE)"))
    with pytest.raises(AssertionError) as e:
        check_kernel(f"{bug}:{attr}", path="v1-fused", scenarios=["default"], runner=RUNNER)
    assert "✗ padding [v1-fused]" in str(e.value) or "✗ matches-reference [v1-fused]" in str(e.value)

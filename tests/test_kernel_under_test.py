"""User kernels through cpsim: ABI detection, adapters, one-line bugs, CLI, vLLM shim."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from cpsim import cli, kernels
from cpsim.kernels import vllm_shim
from cpsim.errors import ConfigError
from cpsim.kernels.under_test import ABIS
from kernel_load import load
from cpsim.plugin.testing import check_kernel
from cpsim.presets import preset
from mutants import mutant
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

kernels.use_interpreter()

HERE = Path(__file__).parent / "kernels"
V1 = f"{HERE}/ascend_v1_abi.py:_compute_slot_mapping_kernel"
ASCEND_V2 = f"{HERE}/ascend_v2_abi.py:_compute_slot_mappings_kernel"
VLLM_V2 = f"{HERE}/vllm_v2_abi.py:_compute_slot_mappings_kernel"
CALLABLE = f"{HERE}/callable_abi.py:slot_mapping"
FUSED = f"{HERE}/ascend_v1_fused_abi.py:_compute_slot_mapping_fused_groups_kernel"
SHIMMED = f"{HERE}/ascend_v2_vllm_imports.py:_compute_slot_mappings_kernel"
WRONG = f"{HERE}/wrong_signature.py:_compute_slot_mapping_kernel"

# Hybrid blocks, a ring, an unsharded attention group, mamba, graph padding,
# shuffled rows, MTP, and small random layouts (each checks at least one group).
SCENARIOS = ("hybrid-mamba", "mtp", "random:1", "random:2", "random:4", "random:7")


@pytest.mark.parametrize("spec,path,abi", [
    (V1, "v1", "ascend-v1"), (ASCEND_V2, "v2", "ascend-v2"), (VLLM_V2, "v2", "vllm-v2"),
    (CALLABLE, "v1", "callable"), (CALLABLE, "v2", "callable"), (FUSED, "v1-fused", "ascend-v1-fused"),
    ("cpsim.kernels.triton_v1:_compute_slot_mapping_kernel", "v1", "ascend-v1"),
], ids=["ascend-v1", "ascend-v2", "vllm-v2", "callable-v1", "callable-v2", "ascend-v1-fused", "builtin-v1"])
def test_abi_is_detected_from_parameter_names(spec, path, abi):
    assert load(spec, path).abi == abi


@pytest.mark.parametrize("spec,path", [(V1, "v1"), (ASCEND_V2, "v2"), (VLLM_V2, "v2"), (CALLABLE, "v1"),
                                       (CALLABLE, "v2")],
                         ids=["ascend-v1", "ascend-v2", "vllm-v2", "callable-v1", "callable-v2"])
def test_kernels_in_each_abi_pass_every_invariant(spec, path):
    results = check_kernel(spec, path=path, scenarios=SCENARIOS, runner=RUNNER)
    checked = [v for vs in results.values() for v in vs if v.status == "pass"]
    assert {v.invariant for v in checked} >= {"exactly-one-owner", "owner-rule", "dense-local", "no-collision",
                                              "padding", "matches-reference", "block-sizing"}


def test_fused_kernel_passes_at_cp1():
    results = check_kernel(FUSED, scenarios=("hybrid-mamba", "random:4", "default"), runner=RUNNER)
    assert all(name.endswith("@cp1") for name in results)  # the fused path exists at CP size 1 only


@pytest.mark.parametrize("spec,path,old,new,scenario,invariant", [
    # vllm-ascend #11774: padding from the padded token count leaves graph-padding entries unwritten.
    (V1, "v1", "pad_from = tl.load(query_start_loc_ptr + req)", "pad_from = num_tokens",
     "hybrid-mamba", "padding"),
    (ASCEND_V2, "v2", "off = (vo // (CP_SIZE * CP_INTERLEAVE)) * CP_INTERLEAVE + vo % CP_INTERLEAVE",
     "off = vo // CP_SIZE", "hybrid-mamba", "dense-local"),
    (VLLM_V2, "v2", "mine = (vo // CP_INTERLEAVE) % CP_SIZE == cp_rank",
     "mine = (vo // CP_INTERLEAVE) % CP_SIZE == (cp_rank + 1) % CP_SIZE", "mtp", "owner-rule"),
    (CALLABLE, "v1", "+ local // block_size", "+ local // block_size + 1", "mtp", "dense-local"),
], ids=["ascend-v1-stale-tail", "ascend-v2-no-interleave", "vllm-v2-wrong-owner", "callable-off-by-one"])
def test_one_line_bug_fails_with_the_expected_invariant(tmp_path, spec, path, old, new, scenario, invariant):
    with pytest.raises(AssertionError) as e:
        check_kernel(mutant(tmp_path, spec, old, new), path=path, scenarios=[scenario], runner=RUNNER)
    assert f"✗ {invariant} [{path}]" in str(e.value)


def test_wrong_signature_lists_the_expected_parameters():
    with pytest.raises(ConfigError) as e:
        load(WRONG, "v1")
    msg = str(e.value)
    assert "matches no kernel ABI" in msg and "unexpected BLOCK" in msg
    for abi in ABIS:  # the expected parameter list of every Triton ABI
        assert (f"  {abi}: (" in msg) == (abi != "callable")
    assert "query_start_loc_ptr" in msg and "slot_mappings_stride" in msg


def test_forced_abi_and_path_mismatches_are_config_errors():
    with pytest.raises(ConfigError, match="missing idx_mapping"):
        load(V1, "v1", abi="vllm-v2")
    with pytest.raises(ConfigError, match="cannot stand in for the v2 path"):
        load(V1, "v2")
    with pytest.raises(ConfigError, match="does not fit a plain callable"):
        load(CALLABLE, "v1", abi="ascend-v1")


@pytest.mark.parametrize("spec,needle", [
    ("no_colon_here", "is not package.module:attr"),
    (f"{HERE}/missing.py:k", "does not exist"),
    (f"{HERE}/ascend_v1_abi.py:nope", "has no attribute"),
    ("cpsim.no_such_module:k", "cannot import cpsim.no_such_module"),
], ids=["no-colon", "no-file", "no-attr", "no-module"])
def test_bad_specs_are_config_errors(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        load(spec, "v1")


@pytest.mark.skipif(importlib.util.find_spec("vllm_ascend") is not None, reason="vllm_ascend is installed here")
def test_shortcut_without_vllm_ascend_says_what_is_missing():
    with pytest.raises(ConfigError, match="needs vllm_ascend installed"):
        load("ascend", "v1")


def test_int32_abi_cannot_hold_slots_past_2_31_and_says_so():
    s = preset("mtp")
    s = s.replace(groups=tuple(dataclasses.replace(g, num_blocks=2**25) for g in s.groups))
    with pytest.raises(AssertionError) as e:
        check_kernel(V1, scenarios=[s], runner=RUNNER)
    assert "the ascend-v1 kernel is handed an int32 slot buffer" in str(e.value)
    assert "✗ matches-reference" in str(e.value)
    check_kernel(VLLM_V2, scenarios=[s], runner=RUNNER)  # the same layout through an int64 ABI holds


def test_single_v2_launch_reproduces_cp_applied_to_unsharded_groups():
    # vLLM #57260: one launch with CP_SIZE for every group breaks the unsharded attention group.
    check_kernel(VLLM_V2, scenarios=["hybrid-mamba"], runner=RUNNER)
    with pytest.raises(AssertionError) as e:
        check_kernel(VLLM_V2, scenarios=["hybrid-mamba"], v2_launch="single", runner=RUNNER)
    assert "✗ exactly-one-owner [v2] group attn-local" in str(e.value)


def test_a_scenario_the_abi_cannot_express_is_not_a_pass():
    s = preset("hybrid-mamba")
    s = s.replace(groups=tuple(g for g in s.groups if g.kind in ("sliding_window", "mamba")))
    with pytest.raises(AssertionError, match="no scenario had a group"):
        check_kernel(VLLM_V2, scenarios=[s], runner=RUNNER)


def test_callable_returning_a_non_tensor_is_a_kernel_output_violation(tmp_path):
    """What a kernel returns is judged (kernel-output, on its rank), not bad input from the user."""
    f = tmp_path / "bad_callable.py"
    f.write_text("def slots(positions):\n    return positions.tolist()\n")
    with pytest.raises(AssertionError, match="kernel-output"):
        check_kernel(f"{f}:slots", scenarios=["mtp"], runner=RUNNER)


@pytest.mark.parametrize("flag,spec", [("--kernel-v1", V1), ("--kernel-v2", ASCEND_V2), ("--kernel-v2", VLLM_V2)],
                         ids=["ascend-v1", "ascend-v2", "vllm-v2"])
def test_cli_run_with_a_user_kernel(flag, spec, capsys):
    path = "v1" if flag == "--kernel-v1" else "v2"
    assert cli.main(["run", "--scenario", "mtp", "--paths", path, flag, spec], runner=RUNNER) == 0
    out = capsys.readouterr().out
    assert "all invariants hold" in out and f"kernel under test on {path}: {spec}" in out


def test_cli_rejects_a_kernel_for_an_unselected_path(capsys):
    assert cli.main(["run", "--paths", "v2", "--kernel-v1", V1], runner=RUNNER) == 2
    assert "--kernel-v1" in capsys.readouterr().err


def test_shim_vllm_loads_a_kernel_importing_vllm(capsys):
    try:
        assert cli.main(["run", "--scenario", "mtp", "--paths", "v2", "--kernel-v2", SHIMMED], runner=RUNNER) == 2
        assert "--shim-vllm" in capsys.readouterr().err
        assert cli.main(["run", "--scenario", "mtp", "--paths", "v2", "--kernel-v2", SHIMMED, "--shim-vllm"], runner=RUNNER) == 0
        assert "all invariants hold" in capsys.readouterr().out
        vllm_shim.install()  # the kernel was imported in the worker; the shim itself, here
        from vllm.triton_utils import HAS_TRITON, tl, triton
        assert HAS_TRITON and tl is __import__("triton.language").language and triton is sys.modules["triton"]
    finally:
        vllm_shim.uninstall()

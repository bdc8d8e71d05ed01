"""The ABIs of released vLLM / vllm-ascend kernels (docs/UPSTREAM_ABIS.md): detection by parameter
names, a kernel of our own in each signature that passes, and one-line-broken twins that fail."""

from __future__ import annotations

from pathlib import Path

import dataclasses

import pytest

from cpsim import kernels
from cpsim.errors import ConfigError
from cpsim.kernels.abi_match import choose_abi
from cpsim.kernels.under_test import ABIS
from kernel_load import load
from cpsim.plugin.testing import check_kernel
from cpsim.presets import preset
from cpsim.scenario import Request
from mutants import mutant
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

kernels.use_interpreter()

K = Path(__file__).parent / "kernels"
V1_019 = f"{K}/vllm_v1_019_abi.py:_compute_slot_mapping_kernel"
V1_026 = f"{K}/vllm_v1_026_abi.py:_compute_slot_mapping_kernel"
V1_032 = f"{K}/vllm_v1_032_abi.py:SlotMappingLauncher.kernel"
MRV2_018 = f"{K}/vllm_mrv2_018_abi.py:_compute_slot_mappings_kernel"
MRV2_029 = f"{K}/vllm_mrv2_029_abi.py:_compute_slot_mappings_kernel"
MRV2_031 = f"{K}/vllm_mrv2_031_abi.py:_compute_slot_mappings_kernel"
MRV2_032 = f"{K}/vllm_mrv2_032_abi.py:_compute_slot_mappings_kernel"
ASCEND_V2_018 = f"{K}/ascend_v2_018_abi.py:_compute_slot_mappings_kernel"

# (spec, path, forced ABI, the ABI it must be, scenarios it must pass)
KERNELS = {
    "vllm-v1-0.19": (V1_019, "v1", "auto", ("default", "mtp")),
    "vllm-v1-0.26": (V1_026, "v1", "auto", ("default", "hybrid-mamba")),
    "vllm-v1-0.32": (V1_032, "v1", "auto", ("default", "hybrid-mamba")),
    "vllm-mrv2-0.18": (MRV2_018, "v2", "auto", ("default",)),
    "vllm-mrv2-0.29": (MRV2_029, "v2", "auto", ("default", "ring-sharded")),
    "vllm-mrv2-0.31": (MRV2_031, "v2", "auto", ("default", "dcp-replicated")),
    "vllm-mrv2-0.32": (MRV2_032, "v2", "auto", ("default", "dcp-replicated", "hybrid-mamba", "dummy-tokens")),
    "ascend-v2-0.18": (ASCEND_V2_018, "v2", "auto", ("default",)),
}


def dcp_replicated():
    """partial-replica with its CP-4 group sharded over all of DCP instead: vLLM has no partial replicas
    (under its profiles that group is exit 2), so its releases meet sharded and replicated groups only."""
    s = preset("partial-replica")
    groups = tuple(dataclasses.replace(g, cp_size=0) if g.name == "attn-cp4" else g for g in s.groups)
    return dataclasses.replace(s, groups=groups, name="dcp-replicated")


def ring_sharded():
    """hybrid-mamba with every attention group sharded (vLLM 0.29-0.30 have no replicated groups): its ring
    is those releases' CircularBufferSpec, launched with slot_mapping_enabled false (all PAD)."""
    s = preset("hybrid-mamba")
    groups = tuple(dataclasses.replace(g, cp_size=0, cp_sharded=True) if g.kind == "attention" else g
                   for g in s.groups)
    return dataclasses.replace(s, groups=groups, name="ring-sharded")


def dummy_with_tokens():
    """dcp-replicated with its dummy request (idx_mapping -1) scheduling 3 padding tokens, as a
    runner's graph padding does: vLLM 0.31+ kernels must write PAD for them on every rank."""
    s = dcp_replicated()
    reqs = list(s.batch.requests)
    assert reqs[-1].kind == "dummy" and s.batch.rows_v2()[len(reqs) - 1] == -1
    first = s.batch.num_tokens
    reqs[-1] = Request(context_len=0, num_tokens=3, kind="dummy")
    batch = dataclasses.replace(s.batch, requests=tuple(reqs), is_padding=s.batch.is_padding + (first, first + 1, first + 2))
    return dataclasses.replace(s, batch=batch, name="dummy-tokens")


def _scenario(name):
    return {"dummy-tokens": dummy_with_tokens, "dcp-replicated": dcp_replicated,
            "ring-sharded": ring_sharded}.get(name, lambda: name)()


@pytest.mark.parametrize("abi", KERNELS)
def test_released_abi_is_detected_by_its_names(abi):
    spec, path, forced, _ = KERNELS[abi]
    assert load(spec, path, forced).abi == abi


def test_wrapper_class_and_its_instance_stand_for_the_static_kernel():
    for attr in ("SlotMappingLauncher", "LAUNCHER", "SlotMappingLauncher.kernel"):
        assert load(f"{K}/vllm_v1_032_abi.py:{attr}", "v1").abi == "vllm-v1-0.32"


def test_abi_table_applies_to_a_list_of_names():
    # What a worker (or an AST reader) hands the parent: names and whether each has a default.
    for abi in KERNELS:
        assert choose_abi([(n, False) for n in ABIS[abi].required], True) == abi
    # ascend-v2 needs a BLOCK_TABLE_* size on top of vLLM 0.18-0.28's list
    names = [(n, False) for n in ABIS["vllm-mrv2-0.18"].required]
    assert choose_abi(names + [("BLOCK_TABLE_PAD_SIZE", False)], True) == "ascend-v2"


def test_retired_vllm_mrv2_name_is_exit_2_with_the_new_names():
    with pytest.raises(ConfigError, match="cpsim-mrv2.*vllm-mrv2-0.32"):
        choose_abi([("x", False)], True, forced="vllm-mrv2")


def test_plain_function_in_a_triton_signature_gets_the_triton_off_hint():
    def _compute_slot_mappings_kernel(max_num_tokens, idx_mapping, query_start_loc, pos, block_table_ptrs,
                                      block_table_strides, block_sizes, slot_mapping_enabled, dcp_sharded,
                                      slot_mappings_ptr, slot_mappings_stride, cp_rank, CP_SIZE, CP_INTERLEAVE,
                                      PAD_ID, TRITON_BLOCK_SIZE):
        pass
    with pytest.raises(ConfigError, match="vllm-mrv2-0.32 Triton ABI.*CUDA_VISIBLE_DEVICES="):
        load(_compute_slot_mappings_kernel, "v2")


@pytest.mark.parametrize("abi", KERNELS)
def test_our_kernel_in_the_released_signature_passes(abi):
    spec, path, forced, scenarios = KERNELS[abi]
    results = check_kernel(spec, abi=forced, path=path, scenarios=[_scenario(n) for n in scenarios], runner=RUNNER)
    assert len(results) == len(scenarios)


# One-line bugs: (abi, old, new, scenario, the invariant that must fail)
BUGS = [
    ("vllm-v1-0.19", "mine = chunk % TOTAL_CP_WORLD_SIZE == TOTAL_CP_RANK",
     "mine = chunk % TOTAL_CP_WORLD_SIZE == 0", "default", "exactly-one-owner"),
    ("vllm-v1-0.19", "for i in range(num_tokens, max_num_tokens, BLOCK_SIZE):",
     "for i in range(num_tokens + 8, max_num_tokens, BLOCK_SIZE):", "default", "padding"),
    ("vllm-v1-0.26", "entry = (local // KV_CACHE_BLOCK_SIZE) * BLOCKS_PER_KV_BLOCK +",
     "entry = (local // KV_CACHE_BLOCK_SIZE) * 1 +", "default", "matches-reference"),
    ("vllm-v1-0.26", "row = block_table_ptr + req.to(tl.int64) * block_table_stride",
     "row = block_table_ptr", "default", "dense-local"),
    ("vllm-v1-0.32", "local = (chunk // TOTAL_CP_WORLD_SIZE) * CP_KV_CACHE_INTERLEAVE_SIZE +",
     "local = chunk * CP_KV_CACHE_INTERLEAVE_SIZE +", "default", "dense-local"),
    ("vllm-mrv2-0.18", "idx = local // bs", "idx = local // bs + 1", "default", "dense-local"),
    ("vllm-mrv2-0.29", "mine = chunk % CP_SIZE == cp_rank", "mine = chunk % CP_SIZE == 0", "default",
     "exactly-one-owner"),
    ("vllm-mrv2-0.29", "enabled = tl.load(slot_mapping_enabled + group) != 0",
     "enabled = tl.load(slot_mapping_enabled + group) >= 0", "ring-sharded", "matches-reference"),
    ("vllm-mrv2-0.31", "slot = tl.where(ok, blk * kbs + local % kbs, PAD_ID)",
     "slot = tl.where(ok, blk * bs + local % bs, PAD_ID)", "default", "dense-local"),
    ("vllm-mrv2-0.31", "sharded = tl.load(dcp_sharded + group) != 0",
     "sharded = tl.load(dcp_sharded + group) >= 0", "dcp-replicated", "exactly-one-owner"),
    ("vllm-mrv2-0.32", "ok = mask & mine & enabled & (row >= 0) & (idx < stride)",
     "ok = mask & mine & enabled & (idx < stride)", "dummy-tokens", "row-bounds"),
    ("vllm-mrv2-0.32", "pad_from = tl.load(query_start_loc + batch_idx)",
     "pad_from = tl.load(query_start_loc + batch_idx) + 8", "default", "padding"),
    ("vllm-mrv2-0.32", "mine = (chunk % CP_SIZE == cp_rank) | ~sharded",
     "mine = (chunk % CP_SIZE == cp_rank) | sharded", "dcp-replicated", "exactly-one-owner"),
    ("ascend-v2-0.18", "local = (chunk // CP_SIZE) * CP_INTERLEAVE + p % CP_INTERLEAVE",
     "local = (chunk // CP_SIZE) * CP_INTERLEAVE", "default", "dense-local"),
]


@pytest.mark.parametrize("abi,old,new,scenario,invariant", BUGS,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BUGS)])
def test_one_line_broken_twin_fails(tmp_path, abi, old, new, scenario, invariant):
    spec, path, forced, _ = KERNELS[abi]
    with pytest.raises(AssertionError) as e:
        check_kernel(mutant(tmp_path, spec, old, new), abi=forced, path=path, scenarios=[_scenario(scenario)], runner=RUNNER)
    assert f"✗ {invariant} [{path}]" in str(e.value)


def test_shim_covers_the_imports_of_released_v1_files(capsys):
    from cpsim import cli
    from cpsim.kernels import vllm_shim
    spec = f"{K}/vllm_v1_032_vllm_imports.py:_SLOT_LAUNCHER"
    try:
        assert cli.main(["run", "--scenario", "default", "--paths", "v1", "--kernel-v1", spec, "--shim-vllm",
                         "--quiet"], runner=RUNNER) == 0
        assert load(spec, "v1", shim_vllm=True).abi == "vllm-v1-0.32"
        vllm_shim.install()  # the kernel is imported in a worker; the stand-ins are checked here
        from vllm.v1.utils import CpuGpuBuffer
        with pytest.raises(RuntimeError, match="shim-vllm stand-in"):
            CpuGpuBuffer(4)
    finally:
        vllm_shim.uninstall()


def test_shim_error_does_not_ask_for_the_shim_when_it_is_on():
    from cpsim.kernels import vllm_shim
    spec = f"{K}/vllm_missing_import.py:kernel"
    try:
        with pytest.raises(ConfigError) as e:
            load(spec, "v1", shim_vllm=True)
        assert "--shim-vllm is on but does not provide vllm.v1.sample" in str(e.value)
        assert "run with --shim-vllm" not in str(e.value)
    finally:
        vllm_shim.uninstall()
    with pytest.raises(ConfigError, match="run with --shim-vllm"):
        load(spec, "v1")


@pytest.mark.parametrize("path", ["v1", "v2"])
@pytest.mark.parametrize("name", ["vllm", "ascend"])
def test_shortcuts_name_the_package_they_need(path, name):
    import importlib.util
    package = "vllm" if name == "vllm" else "vllm_ascend"
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    with pytest.raises(ConfigError, match=f"needs {package} installed"):
        load(name, path)


def _callable_without(tmp_path, name):
    """tests/kernels/callable_abi.py with input ``name`` dropped from its signature (a constant instead)."""
    text = (K / "callable_abi.py").read_text()
    value = {"is_circular": "False", "cp_rank": "0"}[name]
    sig = "cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):"
    assert text.count(sig) == 1
    text = text.replace(sig, sig.replace(f"{name}, ", "") + f"\n    {name} = {value}")
    out = tmp_path / f"callable_without_{name}.py"
    out.write_text(text)
    return f"{out}:slot_mapping"


def test_callable_that_does_not_ask_for_its_cp_rank_is_judged_and_fails(tmp_path):
    """A kernel blind to CP is what the checks are for: it is judged, not excused."""
    from cpsim.plugin.testing import load_kernel, run_one
    from cpsim.presets import preset
    k = load_kernel(_callable_without(tmp_path, "cp_rank"), "v1", runner=RUNNER)
    s, verdicts = run_one(k, "v1", preset("mtp"), runner=RUNNER)
    assert any(v.status == "fail" and v.invariant == "exactly-one-owner" for v in verdicts)
    assert not any("not checked: ask for cp_rank" in n for n in k.notes)


@pytest.mark.parametrize("name,scenario", [("is_circular", "hybrid-mamba")])
def test_callable_that_does_not_ask_is_not_checked_and_told_what_to_ask(tmp_path, name, scenario):
    from cpsim.plugin.testing import load_kernel, run_one
    from cpsim.presets import preset
    k = load_kernel(_callable_without(tmp_path, name), "v1", runner=RUNNER)
    assert name not in k.params
    s, verdicts = run_one(k, "v1", preset(scenario), runner=RUNNER)
    assert all(v.status != "fail" for v in verdicts)
    assert any(f"not checked: ask for {name}" in n for n in k.notes)

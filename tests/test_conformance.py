"""Adapter conformance (cpsim.stack.conformance): the comparison names the argument that differs, and cpsim's
adapters launch a kernel as a host of the release's layout does (a fake host of our own, tests/conformance_hosts);
the drifts it found (vLLM 0.17.0's graph-padded num_tokens, 0.22-0.28's kernel-block tables) fail it when put back."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from cpsim.kernels.abi_match import choose_abi
from cpsim.kernels.under_test import ABIS
from kernel_load import load
from cpsim.paths import v2
from cpsim.paths.types import Knobs
from cpsim.plugin.testing import check_kernel
from cpsim.presets import preset
from cpsim.stack import conformance, recording_kernel
from conformance_hosts import mrv2_host
from mutants import mutant
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

PARAMS_017 = ("num_tokens",) + ABIS["vllm-mrv2-0.18"].required
PARAMS_022 = ABIS["vllm-mrv2-0.22"].required


def _launch(**change):
    args = dict(max_num_tokens=64, idx_mapping=torch.tensor([2, -1, 0], dtype=torch.int32), cp_rank=1, CP_SIZE=2,
                block_sizes=torch.tensor([16, 64], dtype=torch.int32))
    args.update(change)
    return recording_kernel.record("k", (2, 4), args, tuple(args))


def test_comparison_names_the_one_argument_that_differs_and_both_values():
    same = conformance.compare([_launch()], [_launch()])
    assert same == []
    diffs = conformance.compare([_launch()], [_launch(block_sizes=torch.tensor([16, 128], dtype=torch.int32))])
    assert [(d.argument, d.host, d.cpsim) for d in diffs] == [("block_sizes", "int32 [2] [16, 64]",
                                                               "int32 [2] [16, 128]")]
    assert "release passes int32 [2] [16, 64], cpsim's adapter int32 [2] [16, 128]" in diffs[0].line()
    dtype = conformance.compare([_launch()], [_launch(idx_mapping=torch.tensor([2, -1, 0], dtype=torch.int64))])
    assert [d.argument for d in dtype] == ["idx_mapping"]
    assert [d.argument for d in conformance.compare([_launch()], [_launch(), _launch()])] == ["launches"]
    flag = conformance.compare([_launch()], [_launch(CP_SIZE=4)])
    assert [(d.argument, d.host, d.cpsim) for d in flag] == [("CP_SIZE", "int 2", "int 4")]


def test_a_stride_is_compared_as_the_row_stride_it_describes():
    buf, guarded = torch.zeros(2, 64, dtype=torch.int64), torch.zeros(2, 80, dtype=torch.int64)[:, 8:72]
    host = recording_kernel.record("k", (1,), dict(out=buf, out_stride=64), ())
    mine = recording_kernel.record("k", (1,), dict(out=guarded, out_stride=80), ())
    assert conformance.compare([host], [mine]) == []
    wrong = recording_kernel.record("k", (1,), dict(out=guarded, out_stride=64), ())
    assert [d.argument for d in conformance.compare([host], [wrong])] == ["out_stride"]


def _fake_host_launches(s, rank: int, kernel_blocks: bool, num_tokens_arg: bool) -> list[dict]:
    launches: list = []
    params = PARAMS_017 if num_tokens_arg else PARAMS_022
    mrv2_host._compute_slot_mappings_kernel = recording_kernel.RecordingKernel("_compute_slot_mappings_kernel", params,
                                                                       launches)
    host = mrv2_host.BlockTables([g.block_size for g in s.groups], [g.b for g in s.groups], s.limits.max_num_reqs,
                                 _buffer(s, kernel_blocks), [_width(s, g, kernel_blocks) for g in s.groups],
                                 s.cp.world, rank, s.cp.interleave, kernel_blocks, num_tokens_arg)
    positions = np.zeros(max(s.batch.num_tokens_padded, s.batch.num_tokens), dtype=np.int64)
    positions[: s.batch.num_tokens] = s.batch.positions()
    mrv2_host.run_step(host, list(s.batch.rows_v2()), conformance.job_blocks(s), s.batch.query_start_loc(),
                       positions, len(positions))
    return launches


def _buffer(s, kernel_blocks: bool) -> int:
    """The fake host's slot buffer: the budget, as 0.22-0.28 size it; the 0.17.0 layout keeps cpsim's buffer
    (the vllm-v2 adapter's: 0.17.0 is judged by cpsim's profile, whose capacity wants the draft reserve)."""
    return s.limits.max_num_batched_tokens if kernel_blocks else s.limits.slot_buffer_size


def _width(s, g, kernel_blocks: bool) -> int:
    """The fake host's table width: cpsim's, but a state group's as 0.27-0.28's runner sizes it
    (cdiv(max_model_len, B x DCP) + the draft blocks) in the 0.22-0.28 layout."""
    if kernel_blocks and not g.slot_mapped:
        return -(-s.limits.max_model_len // (g.block_size * s.cp.dcp)) + s.limits.num_speculative_tokens
    return v2.table_width(s, g, Knobs())


def _graph_padded():
    s = preset("default", dcp=2)
    assert s.batch.num_tokens_padded > s.batch.num_tokens and any(g.b < g.block_size for g in s.groups)
    return s


def test_vllm_v2_adapter_passes_the_graph_padded_count_as_0_17_does():
    s = _graph_padded()
    host = _fake_host_launches(s, 1, kernel_blocks=False, num_tokens_arg=True)
    assert host[0]["args"]["num_tokens"]["value"] == s.batch.num_tokens_padded
    assert choose_abi([(n, False) for n in PARAMS_017], True) == "vllm-v2"
    mine = conformance.adapter_launches(s, "v2", 1, "vllm-v2", list(PARAMS_017))
    assert conformance.compare(host, mine, conformance.job_blocks(s)) == []


def test_a_drifted_vllm_v2_adapter_fails_naming_num_tokens(monkeypatch):
    """The adapter as it was (the scheduled count): the comparison names num_tokens and both counts."""
    s = _graph_padded()
    host = _fake_host_launches(s, 0, kernel_blocks=False, num_tokens_arg=True)
    from cpsim.paths import prep
    batch = prep.PerRank.batch

    def scheduled(self, *a, **k):
        bt, extra = batch(self, *a, **k)
        return dataclasses.replace(bt, num_tokens=bt.num_scheduled), extra
    monkeypatch.setattr(prep.PerRank, "batch", scheduled)
    diffs = conformance.compare(host, conformance.adapter_launches(s, "v2", 0, "vllm-v2", list(PARAMS_017)))
    assert [(d.argument, d.host, d.cpsim) for d in diffs] == [
        ("num_tokens", f"int {s.batch.num_tokens_padded}", f"int {s.batch.num_tokens}")]


def test_mrv2_0_22_adapter_hands_kernel_block_tables_as_0_22_to_0_28_do():
    s = _graph_padded()
    host = _fake_host_launches(s, 1, kernel_blocks=True, num_tokens_arg=False)
    blocks = conformance.job_blocks(s)
    assert conformance.compare(host, conformance.adapter_launches(s, "v2", 1, "vllm-mrv2-0.22", list(PARAMS_022)),
                               blocks) == []
    # the ABI main gave these releases (physical tables, block_sizes = B): the check names what differs
    old = conformance.compare(host, conformance.adapter_launches(s, "v2", 1, "vllm-mrv2-0.18", list(PARAMS_022)),
                              blocks)
    named = {d.argument for d in old}
    assert {"block_sizes", "block_table_ptrs[0] entries", "block_table_ptrs[0] row stride"} <= named
    entries = next(d for d in old if d.argument == "block_table_ptrs[0] entries")
    assert "kernel-block (x2)" in entries.host and "physical" in entries.cpsim


def test_mrv2_abi_follows_the_release_its_file_is_of(tmp_path):
    src = "tests/kernels/vllm_mrv2_018_abi.py"
    for release, abi in (("0.21.0", "vllm-mrv2-0.18"), ("0.26.0", "vllm-mrv2-0.22")):
        folder = tmp_path / f"vllm-{release}" / "vllm" / "v1" / "worker" / "gpu"
        folder.mkdir(parents=True)
        (folder / "block_table.py").write_text(open(src).read())
        assert load(f"{folder / 'block_table.py'}:_compute_slot_mappings_kernel", "v2").abi == abi
    assert load(f"{src}:_compute_slot_mappings_kernel", "v2").abi == "vllm-mrv2-0.18"  # release unknown


def test_twin_of_0_17_padding_from_num_tokens_fails_under_its_adapter(tmp_path):
    """vLLM 0.17.0's kernel pads from num_tokens, which its host sets to the graph-padded count: the tokens
    between the scheduled and the padded count keep stale slots (passed while the adapter handed the
    scheduled count)."""
    spec = "tests/kernels/vllm_v2_abi.py:_compute_slot_mappings_kernel"
    check_kernel(spec, abi="vllm-v2", path="v2", scenarios=["default"], runner=RUNNER)
    twin = mutant(tmp_path, spec, "for i in range(tl.load(query_start_loc + batch_idx), max_num_tokens,",
                  "for i in range(num_tokens, max_num_tokens,")
    with pytest.raises(AssertionError, match=r"✗ padding \[v2\]"):
        check_kernel(twin, abi="vllm-v2", path="v2", scenarios=["default"], runner=RUNNER)


def test_twin_of_0_22_virtual_block_from_block_sizes_fails_under_its_adapter():
    """vLLM 0.22-0.28 build the DCP virtual block from block_sizes, which their host fills with the kernel
    block b: with an interleave past b ownership is decided in the wrong span (passed while the adapter
    handed these releases physical tables and B)."""
    spec = "tests/kernels/vllm_mrv2_022_virtual_from_block_sizes.py:_compute_slot_mappings_kernel"
    with pytest.raises(AssertionError, match=r"✗ owner-rule \[v2\]"):
        check_kernel(spec, abi="vllm-mrv2-0.22", path="v2", scenarios=["hybrid-interleave"], runner=RUNNER)
    check_kernel("tests/kernels/vllm_mrv2_018_abi.py:_compute_slot_mappings_kernel", abi="vllm-mrv2-0.22",
                 path="v2", scenarios=["hybrid-interleave", "default"], runner=RUNNER)


def _replayed_past_kernel_block(replay_start: int):
    """The shrunk ``v2:attention:replayed-is-pad:replay`` fuzz finding of vLLM 0.23.0 / 0.26.0's released kernel:
    DCP 2, interleave I = B = 64 over kernel blocks b = 32, one decode token at position 64, replayed in a
    group that left prefix caching (so its replayed tokens keep their slots)."""
    from cpsim.scenario import Batch, CPConfig, KVGroup, Limits, Request, Scenario, validate
    group = KVGroup("swa-left-cache", "attention", 64, 32, num_blocks=8, prefix_cacheable=False,
                    prefix_replay_tokens=16)
    batch = Batch((Request(64, 1, "decode", replay_start=replay_start),), (0,))
    return validate(Scenario("replayed-past-kernel-block", CPConfig(dcp=2, interleave=64), (group,),
                             Limits(max_model_len=256, max_num_reqs=1, max_num_batched_tokens=8), batch))


def test_0_22_replayed_is_pad_finding_is_the_virtual_block_defect():
    """The replayed token of a group that left prefix caching is put on rank (64 % (b x 2)) // I = 0, its
    owner is (64 // I) % 2 = 1: replayed-is-pad sees the holder lose it, owner-rule sees it misplaced. The
    same token without the replay still fails owner-rule (one defect, the virtual block b x CP), and the
    release arithmetic with B x CP passes both."""
    twin = "tests/kernels/vllm_mrv2_022_virtual_from_block_sizes.py:_compute_slot_mappings_kernel"
    with pytest.raises(AssertionError, match=r"(?s)✗ owner-rule \[v2\].*✗ replayed-is-pad \[v2\]"):
        check_kernel(twin, abi="vllm-mrv2-0.22", path="v2", scenarios=[_replayed_past_kernel_block(64)], runner=RUNNER)
    with pytest.raises(AssertionError, match=r"✗ owner-rule \[v2\]") as no_replay:
        check_kernel(twin, abi="vllm-mrv2-0.22", path="v2", scenarios=[_replayed_past_kernel_block(0)], runner=RUNNER)
    assert "✗ replayed-is-pad" not in str(no_replay.value)
    check_kernel("tests/kernels/vllm_mrv2_018_abi.py:_compute_slot_mappings_kernel", abi="vllm-mrv2-0.22",
                 path="v2", scenarios=[_replayed_past_kernel_block(64), _replayed_past_kernel_block(0)], runner=RUNNER)


def test_ascend_0_23_capacity_reserves_drafts_on_v1_only():
    """vllm-ascend 0.18.0 / 0.23.0.post1's MRV2 AscendBlockTables holds max_num_batched_tokens entries, its v1
    BlockTable the draft slots too: under that profile a budget-sized buffer passes on v2 and fails on v1,
    and a v2 buffer one entry short of the budget fails."""
    from types import SimpleNamespace
    from cpsim.check import coordinator, profiles
    s = preset("default")
    lim = s.limits
    assert lim.slot_buffer_size > lim.max_num_batched_tokens
    ctx = SimpleNamespace(s=s, n=s.batch.num_tokens, profile=profiles.PROFILES["vllm-ascend-0.23"])
    assert coordinator.capacity(ctx, "v2", lim.max_num_batched_tokens) == []
    assert [v.invariant for v in coordinator.capacity(ctx, "v2", lim.max_num_batched_tokens - 1)] == ["capacity"]
    assert [v.invariant for v in coordinator.capacity(ctx, "v1", lim.max_num_batched_tokens)] == ["capacity"]
    assert coordinator.capacity(ctx, "v1", lim.slot_buffer_size) == []


def test_released_adapters_hand_the_release_buffer_and_state_width():
    """The budget-sized slot buffer (vLLM 0.23-0.33, vllm-ascend's AscendBlockTables), the state group's
    table as the release's runner sizes it, and vLLM 0.19-0.25's v1 launch for the state group too."""
    s = preset("default", dcp=4)
    mamba = next(i for i, g in enumerate(s.groups) if not g.slot_mapped)
    v1 = conformance.adapter_launches(s, "v1", 0, "vllm-v1-0.19", list(ABIS["vllm-v1-0.19"].required))
    assert len(v1) == len(s.groups)
    assert {x["args"]["max_num_tokens"]["value"] for x in v1} == {s.limits.max_num_batched_tokens}
    assert len(conformance.adapter_launches(s, "v1", 0, "vllm-v1-0.26", list(ABIS["vllm-v1-0.26"].required))) \
        == len(s.groups) - 1
    mrv2 = conformance.adapter_launches(s, "v2", 0, "vllm-mrv2-0.31", list(ABIS["vllm-mrv2-0.31"].required))
    g = s.groups[mamba]
    assert mrv2[0]["args"]["block_table_ptrs"]["tables"][mamba]["stride"] == \
        -(-s.limits.max_model_len // g.block_size) + s.limits.num_speculative_tokens
    assert mrv2[0]["args"]["max_num_tokens"]["value"] == s.limits.max_num_batched_tokens


def test_ascend_v2_abi_follows_the_sdist_release_its_file_is_of(tmp_path):
    """vllm-ascend 0.23.0.post1's AscendBlockTables inherits vLLM 0.23.0's kernel-block tables (its runner
    passes kernel_block_sizes); 0.18.0's holds physical ids: the sdist folder's release picks the ABI."""
    src = "tests/kernels/ascend_v2_018_abi.py"
    for release, abi in (("0.18.0", "ascend-v2-0.18"), ("0.23.0.post1", "ascend-v2-0.23")):
        folder = tmp_path / f"vllm_ascend-{release}" / "vllm_ascend" / "worker" / "v2"
        folder.mkdir(parents=True)
        (folder / "block_table.py").write_text(open(src).read())
        assert load(f"{folder / 'block_table.py'}:_compute_slot_mappings_kernel", "v2").abi == abi
    assert load(f"{src}:_compute_slot_mappings_kernel", "v2").abi == "ascend-v2-0.18"  # release unknown


def test_ascend_v2_0_23_adapter_hands_kernel_block_tables_and_block_sizes_b():
    s = _graph_padded()
    params = list(ABIS["ascend-v2-0.23"].required)
    launch = conformance.adapter_launches(s, "v2", 0, "ascend-v2-0.23", params)[0]
    facts = conformance.facts(launch, conformance.job_blocks(s))
    hybrid = next(i for i, g in enumerate(s.groups) if g.b < g.block_size)
    assert launch["args"]["block_sizes"]["values"] == [g.b for g in s.groups]
    assert "kernel-block (x2)" in facts[f"block_table_ptrs[{hybrid}] entries"]
    old = conformance.facts(conformance.adapter_launches(s, "v2", 0, "ascend-v2-0.18", params)[0],
                            conformance.job_blocks(s))
    assert "physical" in old[f"block_table_ptrs[{hybrid}] entries"]
    assert launch["args"]["max_num_tokens"]["value"] == s.limits.max_num_batched_tokens

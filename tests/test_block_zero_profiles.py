"""Block id 0 is a block (per-row live counts), state groups sized by their profile's rule, release profiles.

Slots worked out by hand (SPEC §2): DCP 2, I 1, B 4, one request at positions 0..5. Rank r owns the
positions p with p % 2 == r, the j-th of them at offset j of the rank's first block: rank 0 holds
p = 0, 2, 4 at offsets 0, 1, 2 of its block 0 -> slots 0, 1, 2; rank 1 holds p = 1, 3, 5 in its block 5
-> slots 20, 21, 22. Buffer: 8 entries, the last two PAD.
"""

from __future__ import annotations

import numpy as np
import pytest

from cpsim.capture import batch as xb
from cpsim.capture.steps import Finding
from cpsim.check import explicit, profiles
from cpsim.check.explicit_batch import ExplicitStep, RankBatch
from cpsim.errors import ConfigError
from cpsim.scenario import CPConfig, KVGroup, Limits
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

P = -1
GOOD = ([0, P, 1, P, 2, P, P, P], [P, 20, P, 21, P, 22, P, P])


def _step(slots=GOOD, tables=([[0, 3]], [[5, 0]]), num_blocks=([1], [1]), mamba=None, spec=0):
    groups = [KVGroup("attn", "attention", 4, num_blocks=8)]
    limits = Limits(max_model_len=16, max_num_reqs=1, max_num_batched_tokens=8, num_speculative_tokens=spec)
    ranks = []
    for r in range(2):
        tabs = [np.array(tables[r])]
        live = None if num_blocks is None else [np.array(num_blocks[r])]
        rows = [np.array(slots[r])]
        if mamba is not None:
            tabs.append(np.array(mamba[r]))
            live = None if live is None else live + [np.array([len(mamba[r][0])])]
            rows.append(np.full(8, P))
        ranks.append(RankBatch(np.arange(8), np.array([0, 6]), np.array([0]), 6, tabs, np.array(rows), None, live))
    if mamba is not None:
        groups.append(KVGroup("mamba", "mamba", 4, cp_sharded=False, num_blocks=8))
    return xb.validate(ExplicitStep("v1", CPConfig(dcp=2, interleave=1), tuple(groups),
                                    tuple(g.block_size for g in groups), limits, ranks, {"name": "block0"}))


def _failed(step, profile=None):
    _, _, verdicts = explicit.check(step, profile=profile)
    return {v.invariant for v in verdicts if v.status == "fail"}


def test_block_id_0_is_a_block_and_its_slots_pass():
    assert _failed(_step()) == set()


def test_block_id_0_slots_read_as_pad_fail():
    """The old reference's expectation (block 0 = no block -> PAD) is a wrong mapping now."""
    bad = ([P] * 8, GOOD[1])
    assert {"matches-reference", "exactly-one-owner"} <= _failed(_step(bad))


def test_block_id_0_with_one_slot_off_fails():
    bad = ([0, P, 2, P, 2, P, P, P], GOOD[1])  # p = 2 on rank 0 one slot off: collides with p = 4
    assert {"dense-local", "matches-reference", "no-collision"} <= _failed(_step(bad))


def test_live_count_beyond_the_row_is_exit_2():
    with pytest.raises(ConfigError, match="num_blocks"):
        _step(num_blocks=([3], [1]))


def test_row_of_zeros_with_a_live_count_is_block_0():
    """A row [0, 0] whose live count says 1 is block 0 (without the count a trailing 0 is no block)."""
    assert _failed(_step(tables=([[0, 0]], [[5, 0]]))) == set()
    assert "matches-reference" in _failed(_step(tables=([[0, 0]], [[5, 0]]), num_blocks=None))


def test_num_blocks_round_trip_through_json(tmp_path):
    s = _step()
    xb.save(s, tmp_path / "b0.json")
    t = xb.load(tmp_path / "b0.json")
    assert t.ranks[0].num_blocks[0].tolist() == [1] and _failed(t) == set()


def test_one_entry_mamba_rows_pass_under_vllm_033_and_narrower_fails():
    """vLLM 0.33.0 MambaSpec.max_num_blocks_per_req outside align mode: 1 + num_speculative_blocks."""
    vllm = profiles.get("vllm-0.33")
    assert _failed(_step(mamba=([[1]], [[2]])), vllm) == set()
    assert _failed(_step(mamba=([[1, 3]], [[2, 4]]), spec=1), vllm) == set()
    assert "block-sizing" in _failed(_step(mamba=([[1]], [[2]]), spec=1), vllm)  # the draft's block missing
    # cpsim's model sizes a mamba table per token (cdiv(16, 4) = 4 entries): 1 entry is too narrow there
    assert "block-sizing" in _failed(_step(mamba=([[1]], [[2]])))


def test_wider_attention_table_is_not_a_failure_under_a_release_profile():
    """vLLM aligns widths up to 128 tokens (get_block_table_width): 32 entries of B = 4 for 2 needed."""
    wide = ([[0, 3] + [0] * 30], [[5, 0] + [0] * 30])
    assert _failed(_step(tables=wide), profiles.get("vllm-0.33")) == set()
    assert "block-sizing" in _failed(_step(tables=wide))  # cpsim wants cdiv(16, 4 x 2) = 2 exactly
    assert "block-sizing" in _failed(_step(tables=([[0]], [[5]]), num_blocks=([1], [1])),
                                     profiles.get("vllm-0.33"))  # too narrow fails under every profile


def test_too_narrow_table_names_the_widths_not_dashes():
    step = _step(tables=([[0]], [[5]]))
    s, gath, verdicts = explicit.check(step)
    vio = next(v for verdict in verdicts for v in verdict.violations if v.invariant == "block-sizing")
    line = Finding("block-sizing", "v1", "attn", 0, None, None, None, "-", "-", vio.message).line(step)
    assert "expected -" not in line and "table width 1 < 2" in line


def test_string_notes_are_one_note():
    step = _step()
    step.label["notes"] = "hand-written"
    assert step.notes == ["hand-written"]


def test_profiles_by_abi_and_rules():
    assert profiles.for_abis(["vllm-mrv2-0.32"]).name == "vllm-0.33"
    assert profiles.for_abis(["ascend-v2-0.18"]).name == "vllm-ascend-0.23"
    assert profiles.for_abis(["builtin", "ascend-v1"]).name == "cpsim"
    assert profiles.for_abis(["vllm-v1-0.19", "vllm-v1-0.32"]).name == "cpsim"  # two families: name one
    assert profiles.aligned_width(2, 4) == 32 and profiles.aligned_width(33, 4) == 64
    assert profiles.aligned_width(1, 256) == 1 and profiles.aligned_width(3, 48) == 8
    with pytest.raises(ConfigError, match="--profile"):
        profiles.get("vllm-9.9")


def test_run_picks_the_released_profile_and_names_it(tmp_path, capsys):
    """A kernel in vLLM 0.32-0.33's v1 signature is judged by the vllm-0.33 profile, said in the report."""
    import json
    from pathlib import Path
    from cpsim import cli, kernels
    kernels.use_interpreter()
    spec = f"{Path(__file__).parent / 'kernels'}/vllm_v1_032_abi.py:SlotMappingLauncher.kernel"
    out = tmp_path / "r.json"
    assert cli.main(["run", "--scenario", "default", "--paths", "v1", "--kernel-v1", spec, "--json", str(out)], runner=RUNNER) == 0
    assert "profile: vllm-0.33 (vLLM 0.32.0-0.33.0 v1, 0.32.0-0.34.0 MRV2)" in capsys.readouterr().out
    assert json.loads(out.read_text())["profile"] == "vllm-0.33"
    assert cli.main(["run", "--scenario", "default", "--paths", "v1", "--quiet", "--json", str(out)], runner=RUNNER) == 0
    assert json.loads(out.read_text())["profile"] == "cpsim"


def test_unknown_profile_is_exit_2(capsys):
    from cpsim import cli
    assert cli.main(["run", "--paths", "v1", "--profile", "vllm-9.9", "--quiet"], runner=RUNNER) == 2
    assert "--profile" in capsys.readouterr().err


def test_strict_sizing_notes_wider_tables_and_bigger_buffers_as_waste():
    """32 entries of B = 4 is vLLM's 128-token-aligned width for 2 needed: waste under cpsim, none under
    vllm-0.33; 36 entries is waste under both; a buffer of 10 for 8 entries is waste."""
    from cpsim.check import coordinator

    def waste(tables, profile=None, extra=0):
        slots = tuple(list(r) + [P] * extra for r in GOOD)
        step = _step(slots=slots, tables=tables)
        return coordinator.sizing_waste(explicit.scenario(step), {"v1": explicit.gathered(step)}, profile)

    assert waste(([[0, 3]], [[5, 0]])) == []
    wide = ([[0, 3] + [0] * 30], [[5, 0] + [0] * 30])
    assert len(waste(wide)) == 2 and "table width 32 > 2" in waste(wide)[0]
    assert waste(wide, profiles.get("vllm-0.33")) == []
    wider = ([[0, 3] + [0] * 34], [[5, 0] + [0] * 34])
    assert "table width 36 > 32" in waste(wider, profiles.get("vllm-0.33"))[0]
    assert waste(([[0, 3]], [[5, 0]]), extra=2) == ["v1: slot buffer 10 > 8 entries (scheduled tokens + MTP drafts)"]

"""Release profiles applied by the oracle (SPEC §4.1), and ``--profile`` on every command.

Each rule has a mapping that is right under the release's profile and wrong under cpsim's, the
converse where one exists, and a broken twin that fails under both. Slots are worked out by hand
(SPEC §2): B 4 (16 for the state group, 8 for the ring), I 1, one request at positions 0..5 on a
buffer of 8 entries unless said otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cpsim import cli
from cpsim.capture import batch as xb
from cpsim.check import explicit, profiles
from cpsim.check.explicit_batch import ExplicitStep, RankBatch
from cpsim.errors import ConfigError
from cpsim.presets import preset
from cpsim.scenario import CPConfig, KVGroup, Limits
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

P = -1
ATTN = KVGroup("attn", "attention", 4, num_blocks=64)
# DCP 2: rank 0 holds p = 0, 2, 4 at offsets 0..2 of block 1 (slots 4, 5, 6); rank 1 p = 1, 3, 5 in block 5
ATTN_SLOTS = ([4, P, 5, P, 6, P, P, P], [P, 20, P, 21, P, 22, P, P])
ATTN_TABLES = ([[1, 3]], [[5, 6]])


def _step(path="v2", cp=CPConfig(dcp=2), groups=(ATTN,), tables=None, slots=None, padded=6, tokens=6):
    """One explicit step: ``tables[r][gi]`` and ``slots[r][gi]`` per rank ``r`` and group ``gi``."""
    limits = Limits(max_model_len=16, max_num_reqs=1, max_num_batched_tokens=8)
    ranks = [RankBatch(np.arange(8), np.array([0, tokens]), np.array([0]), padded,
                       [np.array(t) for t in tables[r]], np.array(slots[r]), None,
                       [np.array([len(t[0])]) for t in tables[r]])
             for r in range(cp.world)]
    return xb.validate(ExplicitStep(path, cp, tuple(groups), tuple(g.block_size for g in groups), limits, ranks,
                                    {"name": "profiles"}))


def _failed(step, name="cpsim"):
    _, _, verdicts = explicit.check(step, profile=profiles.get(name))
    return {v.invariant for v in verdicts if v.status == "fail"}


def _dcp2(extra_group=None, extra_tables=None, extra_slots=None, path="v2", attn_slots=ATTN_SLOTS):
    groups, tables, slots = [ATTN], [[ATTN_TABLES[r]] for r in range(2)], [[attn_slots[r]] for r in range(2)]
    if extra_group is not None:
        groups.append(extra_group)
        for r in range(2):
            tables[r].append(extra_tables[r])
            slots[r].append(extra_slots[r])
    return _step(path, groups=groups, tables=tables, slots=slots)


def test_the_attention_mapping_alone_passes_every_profile():
    for name in profiles.PROFILES:
        assert _failed(_dcp2(), name) == set(), name


# ---- (a) padding reach: vllm-ascend pads up to the padded count only --------------------------

def _one_rank(row, padded=6, tokens=4):
    """DCP 1, 4 scheduled tokens at p = 0..3 in block 2 (slots 8..11), graph padding to 6."""
    return _step("v1", CPConfig(), (ATTN,), [[[[2, 3, 4, 5]]]], [[row]], padded=padded, tokens=tokens)


def test_padding_past_the_padded_count_is_not_judged_under_vllm_ascend():
    stale = _one_rank([8, 9, 10, 11, P, P, 7, 7])  # entries 6, 7 left as the previous step wrote them
    assert _failed(stale, "vllm-ascend-0.23") == set()
    assert "padding" in _failed(stale)  # cpsim wants the whole buffer PAD
    assert "padding" in _failed(stale, "vllm-0.33")  # vLLM's kernels pad to the buffer's end
    # the converse cannot exist (the whole buffer PAD is inside both promises): it passes both
    assert _failed(_one_rank([8, 9, 10, 11, P, P, P, P]), "vllm-ascend-0.23") == set()
    assert _failed(_one_rank([8, 9, 10, 11, P, P, P, P])) == set()


def test_padding_inside_the_padded_count_fails_under_both():
    broken = _one_rank([8, 9, 10, 11, P, 7, P, P])  # entry 5 < padded count 6 not PAD
    assert "padding" in _failed(broken, "vllm-ascend-0.23")
    assert "padding" in _failed(broken)


# ---- (b) state (mamba) groups: slots on MRV2 (0.29+), skipped on v1 ------------------------------

MAMBA = KVGroup("mamba", "mamba", 16, cp_sharded=False, num_blocks=8)
MAMBA_TABLES = ([[3]], [[3]])
# vLLM 0.31+ MRV2: slot_mapping_enabled true, dcp_sharded false: table[0][p // 16] * 16 + p % 16 on every rank
MAMBA_UNSHARDED = ([48, 49, 50, 51, 52, 53, P, P],) * 2
# vLLM 0.29-0.30: CP_SIZE applies to every group: rank r holds p % 2 == r, the j-th at offset j
MAMBA_SHARDED = ([48, P, 49, P, 50, P, P, P], [P, 48, P, 49, P, 50, P, P])
ALL_PAD = ([P] * 8,) * 2


def _mamba(slots, path="v2"):
    return _dcp2(MAMBA, MAMBA_TABLES, slots, path)


def test_mamba_slots_on_mrv2_are_right_under_vllm_and_wrong_under_cpsim():
    assert _failed(_mamba(MAMBA_UNSHARDED), "vllm-0.33") == set()
    assert _failed(_mamba(MAMBA_UNSHARDED), "vllm-0.31") == set()
    assert "matches-reference" in _failed(_mamba(MAMBA_UNSHARDED))
    assert _failed(_mamba(MAMBA_SHARDED), "vllm-0.30") == set()
    assert "matches-reference" in _failed(_mamba(MAMBA_SHARDED), "vllm-0.33")  # 0.31+ do not shard state


def test_mamba_pad_is_right_under_cpsim_and_wrong_under_vllm_mrv2():
    assert _failed(_mamba(ALL_PAD)) == set()
    assert "matches-reference" in _failed(_mamba(ALL_PAD), "vllm-0.33")


def test_mamba_slot_one_off_fails_under_both():
    broken = ([49, 50, 51, 52, 53, 54, P, P],) * 2
    assert "matches-reference" in _failed(_mamba(broken), "vllm-0.33")
    assert "matches-reference" in _failed(_mamba(broken))
    tail = ([48, 49, 50, 51, 52, 53, 7, P],) * 2  # stale entry after the scheduled tokens
    assert "padding" in _failed(_mamba(tail), "vllm-0.33")


def test_mamba_on_vllm_v1_is_not_judged_and_says_so():
    """vLLM's v1 skips state groups, leaving their buffer as it was (cpsim's v1 skips them too, SPEC 2.1):
    not judged, with a note naming it n/a; the same buffer on MRV2 is judged and fails."""
    stale = ([7] * 8,) * 2
    assert _failed(_mamba(stale, "v1"), "vllm-0.33") == set()
    assert {"padding", "matches-reference"} <= _failed(_mamba(stale), "vllm-0.33")
    s = explicit.scenario(_mamba(stale, "v1"))
    assert any("mamba on the v1 paths" in n and "n/a" in n for n in profiles.notes(s, profiles.get("vllm-0.33"),
                                                                                  ["v1"]))


# ---- (c) PCP does not shard KV in vLLM ------------------------------------------------------------

def _pcp(slots, tables):
    return _step("v2", CPConfig(dcp=2, pcp=2), (ATTN,), [[t] for t in tables], [[s] for s in slots])


# DCP 2 x PCP 2: vLLM shards over DCP, ranks r and r + 2 (same DCP rank) hold the same shard
DCP_SLOTS = ATTN_SLOTS * 2
DCP_TABLES = ATTN_TABLES * 2
# cpsim's N = 4: rank r holds p % 4 == r, in its own block (cdiv(16, 4 x 4) = 1 entry)
N_TABLES = ([[1]], [[5]], [[6]], [[7]])
N_SLOTS = ([4, P, P, P, 5, P, P, P], [P, 20, P, P, P, 21, P, P], [P, P, 24, P, P, P, P, P],
           [P, P, P, 28, P, P, P, P])


def test_dcp_only_ownership_is_right_under_vllm_and_wrong_under_cpsim():
    assert _failed(_pcp(DCP_SLOTS, DCP_TABLES), "vllm-0.33") == set()
    assert "exactly-one-owner" in _failed(_pcp(DCP_SLOTS, DCP_TABLES))


def test_pcp_x_dcp_ownership_is_right_under_cpsim_and_wrong_under_vllm():
    assert _failed(_pcp(N_SLOTS, N_TABLES)) == set()
    assert _failed(_pcp(N_SLOTS, N_TABLES), "vllm-ascend-0.23") == set()  # vllm-ascend shards over PCP x DCP
    assert {"exactly-one-owner", "block-sizing"} <= _failed(_pcp(N_SLOTS, N_TABLES), "vllm-0.33")


def test_a_pcp_replica_that_drops_a_token_fails_under_both():
    broken = DCP_SLOTS[:2] + ([P, P, 5, P, 6, P, P, P], DCP_SLOTS[3])  # rank 2 lost p = 0
    assert {"exactly-one-owner", "replicas-agree"} <= _failed(_pcp(broken, DCP_TABLES), "vllm-0.33")
    assert "exactly-one-owner" in _failed(_pcp(broken, DCP_TABLES))


def test_the_dcp_layout_is_idempotent_and_noted():
    from cpsim.presets import preset
    s = preset("default", dcp=2, pcp=2)
    t = profiles.scenario_for(s, profiles.get("vllm-0.33"))
    assert [g.world(t.cp) for g in t.groups if g.kind == "attention"] == [2, 2]
    assert profiles.scenario_for(t, profiles.get("vllm-0.33")) is t
    assert profiles.scenario_for(s, profiles.get("cpsim")) is s
    assert any("PCP does not shard KV" in n for n in profiles.notes(t, profiles.get("vllm-0.33"), ["v2"]))


# ---- (d) group layouts each release builds (SPEC §4.1 "Group layouts") ------------------------------

def test_partial_replica_under_a_profile_with_dcp_sharded_is_exit_2_naming_the_field():
    """vLLM 0.31+ (``dcp_sharded``: all of DCP or replicated) and vllm-ascend cannot build a partial replica."""
    part = KVGroup("attn", "attention", 4, num_blocks=64, cp_size=2)
    step = _step("v2", CPConfig(dcp=4), (part,), [[ATTN_TABLES[r % 2]] for r in range(4)],
                 [[ATTN_SLOTS[r % 2]] for r in range(4)])
    assert _failed(step) == set()  # cpsim's model has partial replicas
    for name in ("vllm-0.31", "vllm-0.33", "vllm-ascend-0.23"):
        with pytest.raises(ConfigError, match=r"groups\[0\]\.cp_size.*partial replica"):
            _failed(step, name)


REPL = KVGroup("attn", "attention", 4, num_blocks=64, cp_size=1)
REPL_TABLES = [[[[1, 2, 0, 0]]]] * 2
REPL_SLOTS = [[[4, 5, 6, 7, 8, 9, P, P]]] * 2  # every rank holds every token: table[0][p // 4] * 4 + p % 4
# the DCP transform applied to it (vLLM #57260): rank 0 p = 0, 2, 4 at 4, 5, 6; rank 1 p = 1, 3, 5 at 4, 5, 6
REPL_AS_SHARDED = [[[4, P, 5, P, 6, P, P, P]], [[P, 4, P, 5, P, 6, P, P]]]


def test_replicated_group_is_judged_replicated_under_vllm_0_30():
    """vLLM 0.30.0 builds replicated slot-mapped groups (``MambaSpec``: replicated across DCP, slot-mapped,
    ``gpu/model_runner.py``) and launches them with CP_SIZE = DCP (``gpu/block_table.py``, no
    ``dcp_sharded``): the profile judges a replicated group replicated, so that launch fails, as it did."""
    step = _step("v2", CPConfig(dcp=2), (REPL,), REPL_TABLES, REPL_SLOTS)
    for name in ("vllm-0.30", "vllm-0.31", "vllm-0.33"):
        assert _failed(step, name) == set(), name
    transformed = _step("v2", CPConfig(dcp=2), (REPL,), REPL_TABLES, REPL_AS_SHARDED)
    assert "exactly-one-owner" in _failed(transformed, "vllm-0.30")


@pytest.mark.parametrize("name", ["vllm-0.25", "vllm-0.26"])
def test_replicated_group_is_laid_out_sharded_where_the_release_shards_every_group(name):
    """vLLM 0.19-0.28 shard every attention group over their KV world (0.23.0 ``gpu_model_runner.py``:
    ``cdiv(max_model_len, B x total CP)`` for every group): a replicated group is not refused but laid out
    sharded, as the release builds the model; the replicated mapping then fails and the sharded one holds."""
    assert _failed(_step("v2", CPConfig(dcp=2), (REPL,), REPL_TABLES, REPL_AS_SHARDED), name) == set()
    assert "exactly-one-owner" in _failed(_step("v2", CPConfig(dcp=2), (REPL,), REPL_TABLES, REPL_SLOTS), name)
    s = profiles.scenario_for(preset("hybrid-mamba"), profiles.get(name))
    local = [g for g in s.groups if g.name == "attn-local"][0]
    assert local.world(s.cp) == s.cp.world


# ---- (e) ring-buffer sliding windows: none in released vLLM ---------------------------------------

RING = KVGroup("swa", "sliding_window", 8, num_blocks=8)
RING_TABLES = ([[2]], [[2]])
RING_SLOTS = ([16, 17, 18, 19, 20, 21, P, P],) * 2  # table[0] * 8 + p % 8 on every rank


def _ring(slots, path="v2"):
    return _dcp2(RING, RING_TABLES, slots, path)


def test_ring_as_mrv2_circular_buffer_is_pad_under_vllm_and_wrong_under_cpsim():
    """MRV2 0.29+ launch a CircularBufferSpec with slot_mapping_enabled false: every entry PAD."""
    assert _failed(_ring(ALL_PAD), "vllm-0.33") == set()
    assert "matches-reference" in _failed(_ring(ALL_PAD))


def test_ring_slots_are_right_under_cpsim_and_wrong_under_vllm_mrv2():
    assert _failed(_ring(RING_SLOTS)) == set()
    assert "matches-reference" in _failed(_ring(RING_SLOTS), "vllm-0.33")


def test_ring_slot_one_off_fails_under_both():
    broken = ([17, 18, 19, 20, 21, 22, P, P],) * 2
    assert "matches-reference" in _failed(_ring(broken))
    assert "matches-reference" in _failed(_ring(broken), "vllm-0.33")


def test_ring_on_v1_or_before_0_29_is_not_judged_with_a_note():
    stale = ([7] * 8,) * 2
    assert _failed(_ring(stale, "v1"), "vllm-0.33") == set()
    assert _failed(_ring(stale), "vllm-0.26") == set()
    assert "matches-reference" in _failed(_ring(stale, "v1"))
    s = explicit.scenario(_ring(stale, "v1"))
    assert any("swa" in n and "not judged" in n for n in profiles.notes(s, profiles.get("vllm-0.33"), ["v1"]))


def test_universal_invariants_hold_under_every_profile():
    """A collision is a collision whatever the release: two tokens in one slot fail every profile."""
    broken = ([4, P, 4, P, 6, P, P, P], ATTN_SLOTS[1])
    for name in profiles.PROFILES:
        assert "no-collision" in _failed(_dcp2(attn_slots=broken), name), name


# ---- --profile on every command -------------------------------------------------------------------

VLLM = "vllm-0.33 (vLLM 0.32.0-0.33.0 v1, 0.32.0-0.34.0 MRV2)"


def test_run_accepts_and_shows_the_profile_and_its_notes(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = cli.main(["run", "--scenario", "mtp", "--dcp", "2", "--pcp", "2", "--paths", "v1", "--profile",
                     "vllm-0.33", "--json", str(out)], runner=RUNNER)
    text = capsys.readouterr().out
    assert code == 0 and f"profile: {VLLM}" in text and "PCP does not shard KV" in text
    data = json.loads(out.read_text())
    assert data["profile"] == "vllm-0.33" and any("DCP 2" in n for n in data["profile_notes"])


def test_run_partial_replica_under_vllm_is_exit_2(capsys):
    assert cli.main(["run", "--scenario", "partial-replica", "--paths", "v1", "--profile", "vllm-0.33"], runner=RUNNER) == 2
    assert "groups[1].cp_size" in capsys.readouterr().err


def test_sweep_accepts_and_shows_the_profile(tmp_path, capsys):
    out = tmp_path / "s.json"
    code = cli.main(["sweep", "--presets", "mtp,partial-replica", "--paths", "v1", "--profile", "vllm-0.33",
                     "--json", str(out)], runner=RUNNER)
    text = capsys.readouterr().out  # the skip reason wraps inside its table cell: read it from the JSON
    assert code == 0 and f"profile: {VLLM}" in text and "skipped" in text
    report = json.loads(out.read_text())
    assert report["profile"] == "vllm-0.33"
    reason = report["skipped"]["partial-replica"]
    assert "partial replica" in reason and "not expressible under profile vllm-0.33" in reason


def test_bugs_reproduce_accepts_and_shows_the_profile(tmp_path, capsys):
    out = tmp_path / "b.json"
    code = cli.main(["bugs", "reproduce", "mtp-draft-capacity", "--profile", "vllm-ascend-0.23", "--json", str(out)], runner=RUNNER)
    assert code == 1 and "profile: vllm-ascend-0.23" in capsys.readouterr().out
    assert json.loads(out.read_text())["profile"] == "vllm-ascend-0.23"


def test_fuzz_records_the_profile_and_replay_and_draw_use_it(tmp_path, capsys):
    code = cli.main(["fuzz", "--max-examples", "30", "--seed", "0", "--paths", "v1", "--inject", "mtp-draft-capacity",
                     "--profile", "vllm-ascend-0.23", "--out", str(tmp_path), "--no-db", "--stop-after-first",
                     "--shrink-seconds", "5"], runner=RUNNER)
    assert code == 1 and "profile: vllm-ascend-0.23" in capsys.readouterr().out
    repro = next(tmp_path.glob("repro-*.json"))
    assert json.loads(repro.read_text())["profile"] == "vllm-ascend-0.23"
    assert cli.main(["replay", str(repro)], runner=RUNNER) == 1
    assert "profile: vllm-ascend-0.23" in capsys.readouterr().out
    assert cli.main(["replay", str(repro), "--profile", "cpsim"], runner=RUNNER) == 1
    assert "profile: cpsim" in capsys.readouterr().out
    small = tmp_path / "small.json"  # draw needs a drawable scenario: the repro's profile on a small one
    from cpsim.presets import preset
    small.write_text(json.dumps({**json.loads(repro.read_text()), "scenario": preset("mtp", dcp=2).to_dict()}))
    assert cli.main(["draw", "--repro", str(small), "--out", str(tmp_path / "f.png")], runner=RUNNER) == 1  # the fault, injected
    assert "profile vllm-ascend-0.23" in capsys.readouterr().out
    bad = json.loads(repro.read_text())
    bad["profile"] = "vllm-9.9"
    repro.write_text(json.dumps(bad))
    assert cli.main(["replay", str(repro)], runner=RUNNER) == 2
    assert "repro.profile" in capsys.readouterr().err


def test_draw_accepts_and_shows_the_profile(tmp_path, capsys):
    png = tmp_path / "d.png"
    assert cli.main(["draw", "--scenario", "mtp", "--profile", "vllm-0.33", "--out", str(png)], runner=RUNNER) == 0
    assert "profile vllm-0.33" in capsys.readouterr().out


def test_replay_of_an_explicit_batch_judges_by_the_profile(tmp_path, capsys):
    f = tmp_path / "mamba.json"
    xb.save(_mamba(MAMBA_UNSHARDED), f)
    assert cli.main(["replay", str(f)], runner=RUNNER) == 1  # cpsim expects PAD for the state group
    assert cli.main(["replay", str(f), "--profile", "vllm-0.33"], runner=RUNNER) == 0
    assert f"profile: {VLLM}" in capsys.readouterr().out


def test_pytest_plugin_check_kernel_takes_the_profile():
    from cpsim.plugin.testing import check_kernel
    spec = f"{Path(__file__).parent / 'kernels'}/vllm_mrv2_032_abi.py:_compute_slot_mappings_kernel"
    assert check_kernel(spec, path="v2", scenarios=["default"], runner=RUNNER)  # its own release: vllm-0.33
    with pytest.raises(AssertionError, match=r"profile: cpsim[\s\S]*|matches-reference"):
        check_kernel(spec, path="v2", scenarios=["default"], profile="cpsim", runner=RUNNER)  # mamba slots are not PAD


@pytest.mark.dist
@pytest.mark.e2e
def test_torchrun_run_accepts_and_shows_the_profile():
    """Two ranks under torchrun (launch/cpu-sim.sh): DCP 1 x PCP 2, so vLLM's profile replicates KV over PCP."""
    import os
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT") and not k.startswith("CPSIM_TEST_")}
    env = {**env, "PY": sys.executable, "PYTHONPATH": str(root), "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(root / "launch" / "cpu-sim.sh"), "2", "--scenario", "mtp", "--pcp", "2", "--paths",
                           "v1", "--profile", "vllm-0.33"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"profile: {VLLM}" in proc.stdout and "PCP does not shard KV" in proc.stdout


def test_a_pool_too_small_for_vllms_dcp_only_layout_is_not_expressible():
    """Found by `make upstream-check`'s fuzz of vLLM 0.31.0: under cpsim's layout the group is sharded over
    PCP 2 and each rank needs 1 block of the 2 (block 0 reserved); vLLM shards over DCP 1 only, so each
    rank needs 2 - the allocator's draw failed with a ValueError. It is exit 2 naming the pool."""
    from cpsim import scenario as sc
    s = sc.validate(sc.Scenario(
        "tiny", CPConfig(dcp=1, pcp=2), (KVGroup("attn", "attention", 1, num_blocks=2),),
        Limits(max_model_len=2, max_num_reqs=1, max_num_batched_tokens=2),
        sc.Batch((sc.Request(context_len=0, num_tokens=2, kind="prefill"),))))
    assert profiles.scenario_for(s, profiles.get("cpsim")) is s
    with pytest.raises(ConfigError) as e:
        profiles.scenario_for(s, profiles.get("vllm-0.31"))
    assert e.value.field == "groups[0](attn).num_blocks" and "too small under profile vllm-0.31" in e.value.rule
    roomy = s.replace(groups=(KVGroup("attn", "attention", 1, num_blocks=3),))
    assert profiles.scenario_for(roomy, profiles.get("vllm-0.31")).groups[0].world(roomy.cp) == 1


@pytest.mark.parametrize("width_rule_profile", ["vllm-0.31", "vllm-0.33"])
def test_a_position_indexed_mamba_table_is_wide_enough_under_vllm_profiles(tmp_path, capsys, width_rule_profile):
    """Found by `make upstream-check`'s fuzz of vLLM 0.26.0's v1 kernel: max_model_len 1, B 1, one
    speculative token. cpsim's position-indexed mamba row has cdiv(1, 1) = 1 entry, which every position
    reads; the state-indexed rule 1 + speculative = 2 called it too narrow (a false block-sizing)."""
    scen = {"name": "tiny-mamba", "cp": {"dcp": 1, "pcp": 1, "interleave": 1},
            "groups": [{"name": "m", "kind": "mamba", "block_size": 1, "cp_sharded": False, "num_blocks": 2}],
            "limits": {"max_model_len": 1, "max_num_reqs": 1, "max_num_batched_tokens": 1,
                       "num_speculative_tokens": 1},
            "batch": {"requests": [{"context_len": 0, "num_tokens": 1, "kind": "chunked"}]}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scen))
    out = tmp_path / "r.json"
    code = cli.main(["run", "--scenario", str(path), "--paths", "v2", "--profile", width_rule_profile,
                     "--json", str(out)], runner=RUNNER)
    capsys.readouterr()
    sizing = [v for v in json.loads(out.read_text())["verdicts"] if v["invariant"] == "block-sizing"]
    assert sizing and all(v["status"] == "pass" for v in sizing), sizing
    assert code in (0, 1)

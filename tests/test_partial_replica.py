"""Per-group CP sizes (partial replicas), is_padding and num_blocks: model, oracle, MRV2 kernel.

Each new or changed invariant is fed a mapping broken the way it guards against
and must fail; correct mappings from our kernels must pass everything.
"""

import copy
import json

import pytest
import torch

from cpsim import layout
from cpsim import scenario as sc
from cpsim.presets import preset
from cpsim.random_scenarios import random_scenario
from cpsim.validate import load_scenario
from cpsim.allocator import allocate_world
from cpsim.check import coordinator
from cpsim.errors import ConfigError
from cpsim.layout import PAD_SLOT_ID
from cpsim.run.world import run_virtual
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

FULL, HALF, REPL, RING = 0, 1, 2, 3


@pytest.fixture(scope="module")
def world():
    """CP 4: a group at 4, one at 2 (two replicas), one at 1, a ring; padded drafts and a flagged token."""
    s = sc.validate(sc.Scenario(
        "mixed", sc.CPConfig(dcp=4, interleave=4),
        (sc.KVGroup("cp4", block_size=16, kernel_block_size=8, num_blocks=128),
         sc.KVGroup("cp2", block_size=8, num_blocks=256, cp_size=2),
         sc.KVGroup("cp1", block_size=16, kernel_block_size=4, num_blocks=256, cp_size=1),
         sc.KVGroup("ring", kind="sliding_window", block_size=8, cp_sharded=False, num_blocks=32)),
        sc.Limits(max_model_len=512, max_num_reqs=6, max_num_batched_tokens=200, num_speculative_tokens=3),
        sc.Batch((sc.Request(0, 90), sc.Request(200, 4, "spec", padded_drafts=2), sc.Request(37, 1),
                  sc.Request(0, 0)), (3, 0, 5, -1), num_tokens_padded=110, is_padding=(40,)),
        seed=3))
    return s, allocate_world(s), run_virtual(s, ["v1", "v1-torch", "v2"], runner=RUNNER)


def judge(world, gathered=None):
    s, allocs, g0 = world
    verdicts = coordinator.check(s, allocs, gathered or g0, [s.fingerprint()] * s.cp.world)
    return {(v.invariant, v.path) for v in verdicts if v.status == "fail"}, verdicts


def broken(world, path="v2"):
    g = copy.deepcopy(world[2])
    return g, g[path]


def owner_in_set(world, t, gi, base=0):
    s = world[0]
    pos = int(torch.from_numpy(s.batch.positions())[t])
    return base + layout.owner_rank(pos, s.groups[gi].world(s.cp), s.cp.interleave)


# ---- model -----------------------------------------------------------------

def test_layout_shard_rank_and_replica_sets():
    assert [layout.shard_rank(r, 4) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [layout.shard_rank(r, 1) for r in range(3)] == [0, 0, 0]
    assert [list(x) for x in layout.replica_sets(8, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [list(x) for x in layout.replica_sets(4, 1)] == [[0], [1], [2], [3]]


def test_group_cp_size_and_alias():
    cp = sc.CPConfig(dcp=8)
    assert sc.KVGroup("a").world(cp) == 8
    assert sc.KVGroup("a", cp_size=4).world(cp) == 4
    assert sc.KVGroup("a", cp_size=1).world(cp) == 1
    assert sc.KVGroup("a", cp_sharded=False).world(cp) == 1
    d = preset("default").to_dict()
    d["groups"][1]["cp_size"] = 4
    d["groups"][0]["cp_sharded"] = False
    s = sc.Scenario.from_dict(d)
    assert [g.world(s.cp) for g in s.groups] == [1, 4, 1]


def test_new_fields_keep_old_fingerprints():
    """Defaults are left out of the canonical JSON, so older scenarios hash as before."""
    s = preset("default")
    d = s.to_dict()
    assert "cp_size" not in d["groups"][0] and "is_padding" not in d["batch"]
    assert "padded_drafts" not in d["batch"]["requests"][0]
    assert sc.Scenario.from_dict(json.loads(s.canonical_json())).fingerprint() == s.fingerprint()
    p = preset("partial-replica")
    assert sc.Scenario.from_dict(json.loads(p.canonical_json())) == p


@pytest.mark.parametrize("change, field", [
    (lambda d: d["groups"][1].update(cp_size=3), "cp_size"),
    (lambda d: d["groups"][3].update(cp_size=2), "cp_size"),
    (lambda d: d["groups"][1].update(cp_size=4, cp_sharded=False), "cp_size"),
    (lambda d: d["batch"].update(is_padding=[10**6]), "batch.is_padding"),
    (lambda d: d["batch"].update(is_padding=[3, 3]), "batch.is_padding"),
    (lambda d: d["batch"]["requests"][0].update(padded_drafts=10**6), "padded_drafts"),
])
def test_bad_new_fields_name_field_and_rule(change, field):
    d = preset("partial-replica").to_dict()
    change(d)
    with pytest.raises(ConfigError) as e:
        sc.validate(sc.Scenario.from_dict(d))
    assert field in str(e.value)


def test_padding_mask_and_allocation_stop_at_last_real_token(world):
    s = world[0]
    mask = s.batch.padding_mask()
    assert mask.nonzero()[0].tolist() == [40, 92, 93]
    assert s.batch.allocated_lens() == [90, 202, 38, 0]


def test_preset_shrinks_group_cp_sizes_to_an_overridden_world():
    s = sc.validate(preset("partial-replica", dcp=2))
    assert [g.world(s.cp) for g in s.groups] == [2, 2, 1, 1]


# ---- oracle: correct mappings pass, broken ones fail -------------------------

def test_correct_mixed_mapping_passes_everything(world):
    fails, verdicts = judge(world)
    assert fails == set()
    # nothing replays here: replayed-is-pad does not apply; no user kernel ran: neither do inputs-intact, kernel-output
    assert {v.invariant for v in verdicts if v.status == "pass"} == (
        set(coordinator.INVARIANTS) - {"replayed-is-pad", "inputs-intact", "kernel-output"})


def test_replicas_disagree(world):
    g, G = broken(world)
    t = 5
    r = owner_in_set(world, t, HALF, base=2)  # the holder in the second replica set
    G.slots[r, HALF, t] += 8  # another block's slot: rank r no longer equals rank r % 2
    fails, _ = judge(world, g)
    assert ("replicas-agree", "v2") in fails


def test_replicated_group_ranks_disagree(world):
    g, G = broken(world)
    G.slots[3, REPL, 7] += 1
    fails, _ = judge(world, g)
    assert ("replicas-agree", "v2") in fails


def test_token_twice_inside_one_replica_set(world):
    g, G = broken(world)
    t = 9
    for base in (0, 2):  # both replicas break the same way, so replicas-agree still holds
        r = owner_in_set(world, t, HALF, base)
        other = base + (r - base + 1) % 2
        G.slots[other, HALF, t] = G.slots[r, HALF, t] + 10000
    fails, _ = judge(world, g)
    assert ("exactly-one-owner", "v2") in fails and ("replicas-agree", "v2") not in fails


def test_token_on_wrong_rank_of_its_set(world):
    g, G = broken(world)
    t = 9
    for base in (0, 2):
        r = owner_in_set(world, t, HALF, base)
        other = base + (r - base + 1) % 2
        G.slots[other, HALF, t] = G.slots[r, HALF, t]
        G.slots[r, HALF, t] = PAD_SLOT_ID
    fails, _ = judge(world, g)
    assert ("owner-rule", "v2") in fails and ("exactly-one-owner", "v2") not in fails


def test_token_missing_in_one_replica_set_only(world):
    """Counting holders over all ranks would see 1 of 2 expected; per set it is 0 in set 2."""
    g, G = broken(world)
    t = 9
    r = owner_in_set(world, t, HALF, base=2)
    G.slots[r, HALF, t] = PAD_SLOT_ID
    fails, _ = judge(world, g)
    assert ("exactly-one-owner", "v2") in fails and ("owner-rule", "v2") in fails


def test_dense_local_uses_the_shard_rank(world):
    g, G = broken(world)
    for base in (0, 2):
        row = G.slots[base, HALF]
        mine = (row[:90] >= 0).nonzero().flatten()
        row[mine[3]] += 1  # a hole: offset j % B broken on both replicas alike
    fails, _ = judge(world, g)
    assert ("dense-local", "v2") in fails and ("replicas-agree", "v2") not in fails


def test_padding_token_with_a_slot(world):
    g, G = broken(world)
    t = 40  # flagged is_padding: PAD on every rank in every group
    G.slots[:, REPL, t] = 12345
    fails, _ = judge(world, g)
    assert ("padding", "v2") in fails


def test_padded_draft_with_a_slot_in_a_ring(world):
    g, G = broken(world)
    G.slots[:, RING, 93] = 8 * 3 + 1
    fails, _ = judge(world, g)
    assert ("padding", "v2") in fails


def test_block_sizing_uses_the_group_cp_size(world):
    """The cp2 group's table sized with the world size (4) is too narrow."""
    g, G = broken(world)
    s = world[0]
    G.widths[:, HALF] = layout.table_width(s.limits.max_model_len, 8, 4)
    fails, _ = judge(world, g)
    assert ("block-sizing", "v2") in fails


def test_block_sizing_exact_width_with_g(world):
    """Wider than needed but not cdiv(mml, B x g) x BPK: flagged as the wrong width."""
    g, G = broken(world)
    G.widths[:, FULL] += 2
    fails, _ = judge(world, g)
    assert ("block-sizing", "v2") in fails


# ---- our kernels ---------------------------------------------------------------

@pytest.mark.parametrize("seed", [4, 5, 6, 10, 16, 24])
def test_mrv2_and_v1_match_reference_on_random_mixed_scenarios(seed):
    s = random_scenario(seed, max_world=8, max_groups=4, max_reqs=6, max_model_len=4096)
    assert len({g.world(s.cp) for g in s.groups if g.slot_mapped}) > 1 or s.batch.has_padding
    gathered = run_virtual(s, ["v1", "v1-torch", "v2"], runner=RUNNER)
    verdicts = coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world)
    assert [v for v in verdicts if v.status == "fail"] == []
    assert any(v.invariant == "matches-reference" and v.status == "pass" for v in verdicts)


def test_v2_uses_mrv2_only_when_needed():
    from cpsim.paths import Knobs, v2
    from cpsim import kernels
    assert not v2.needs_mrv2(preset("default"))
    assert v2.needs_mrv2(preset("partial-replica"))
    assert v2.needs_mrv2(preset("default"), Knobs(kernel_fault=kernels.FAULT_PADDING_IGNORED))


def test_partial_replica_preset_passes_at_cp8():
    s = preset("partial-replica")
    assert s.cp.world == 8 and sorted({g.world(s.cp) for g in s.groups}) == [1, 4, 8]
    gathered = run_virtual(s, ["v1", "v2"], runner=RUNNER)
    verdicts = coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * 8)
    assert coordinator.passed(verdicts)
    v2 = gathered["v2"].slots
    assert torch.equal(v2[0:4, 1], v2[4:8, 1])  # the cp4 group's two replicas


def test_fuzz_strategy_draws_group_cp_sizes_and_padding():
    from hypothesis import HealthCheck, given, settings

    from cpsim import fuzz as fz
    seen = set()

    @settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    @given(fz.scenarios())
    def probe(s):
        if any(1 < g.world(s.cp) < s.cp.world for g in s.groups):
            seen.add("partial replica")
        if any(g.cp_size for g in s.groups):
            seen.add("cp_size given")
        if any(r.padded_drafts for r in s.batch.requests):
            seen.add("padded drafts")
        if s.batch.is_padding:
            seen.add("is_padding")

    probe()
    assert seen == {"partial replica", "cp_size given", "padded drafts", "is_padding"}


def test_draw_shows_replica_sets(tmp_path):
    pytest.importorskip("matplotlib")
    from cpsim.cmd.draw import simulate
    from cpsim.report import layout_picture, figure
    s = sc.validate(load_scenario("examples/replicas-cp4.json"))
    from cpsim.paths import Knobs
    from cpsim import kernels
    pic = simulate(s, ["v2"], Knobs(kernel_fault=kernels.FAULT_SHARD_IS_CP_RANK), runner=RUNNER)
    half = next(p for p in pic.panels.values() if p.group.name == "cp2")
    assert any(v.invariant == "replicas-agree" for v in half.violations)
    assert half.strip_bad.any()  # the tokens the second replica set lost are outlined
    fig = figure.render(pic)
    assert "replica sets 0-1, 2-3" in " ".join(ax.get_title(loc="left") for ax in fig.axes)

"""Each invariant, fed a mapping broken the way it guards against, must fail."""

import copy

import pytest
import torch

from cpsim.check import coordinator
from cpsim import scenario as sc
from cpsim.allocator import allocate_world
from cpsim.layout import PAD_SLOT_ID, POISON, owner_rank
from cpsim.run.world import run_virtual

SHARDED, UNSHARDED, RING, MAMBA = 0, 1, 2, 3


@pytest.fixture(scope="module")
def world():
    s = sc.Scenario(
        "coord", sc.CPConfig(dcp=4, interleave=8),
        (sc.KVGroup("attn", block_size=32, kernel_block_size=16, num_blocks=256),
         sc.KVGroup("local", block_size=16, cp_sharded=False, num_blocks=256),
         sc.KVGroup("ring", kind="sliding_window", block_size=16, cp_sharded=False, num_blocks=64),
         sc.KVGroup("state", kind="mamba", block_size=32, cp_sharded=False, num_blocks=64)),
        sc.Limits(max_model_len=2048, max_num_reqs=6, max_num_batched_tokens=400, num_speculative_tokens=2),
        sc.Batch((sc.Request(0, 300), sc.Request(700, 1), sc.Request(90, 3), sc.Request(0, 0)),
                 (4, 0, 2, -1), num_tokens_padded=330), seed=5)
    s = sc.validate(s)
    gathered = run_virtual(s, ["v1", "v1-torch", "v2"])
    return s, allocate_world(s), gathered


def judge(world, gathered=None, fingerprints=None):
    s, allocs, g0 = world
    verdicts = coordinator.check(s, allocs, gathered or g0, fingerprints or [s.fingerprint()] * s.cp.world)
    return {(v.invariant, v.path) for v in verdicts if v.status == "fail"}, verdicts


def broken(world, path="v2"):
    g = copy.deepcopy(world[2])
    return g, g[path]


def test_correct_mapping_passes_everything(world):
    fails, verdicts = judge(world)
    assert fails == set()
    ran = {v.invariant for v in verdicts if v.status == "pass"}
    assert ran == set(coordinator.INVARIANTS)


def _owner(world, t):
    s = world[0]
    pos = int(torch.from_numpy(s.batch.positions())[t])
    return owner_rank(pos, s.cp.world, s.cp.interleave)


def test_token_on_two_ranks(world):
    g, G = broken(world)
    r = _owner(world, 10)
    G.slots[(r + 1) % 4, SHARDED, 10] = G.slots[r, SHARDED, 10] + 1000
    fails, _ = judge(world, g)
    assert ("exactly-one-owner", "v2") in fails


def test_token_on_no_rank(world):
    g, G = broken(world)
    G.slots[_owner(world, 10), SHARDED, 10] = PAD_SLOT_ID
    fails, _ = judge(world, g)
    assert ("exactly-one-owner", "v2") in fails and ("owner-rule", "v2") in fails


def test_token_on_wrong_rank(world):
    g, G = broken(world)
    r = _owner(world, 10)
    G.slots[(r + 1) % 4, SHARDED, 10] = G.slots[r, SHARDED, 10]
    G.slots[r, SHARDED, 10] = PAD_SLOT_ID
    fails, _ = judge(world, g)
    assert ("owner-rule", "v2") in fails
    assert ("exactly-one-owner", "v2") not in fails  # still exactly one holder


def test_hole_in_local_indices(world):
    """Shift one rank's later tokens by one slot: a hole, then offsets off by one."""
    g, G = broken(world)
    r = _owner(world, 0)
    row = G.slots[r, SHARDED]
    mine = (row[:300] >= 0).nonzero().flatten()
    row[mine[5]] = row[mine[5]] + 1
    fails, verdicts = judge(world, g)
    assert ("dense-local", "v2") in fails


def test_repeat_in_local_indices(world):
    g, G = broken(world)
    r = _owner(world, 0)
    row = G.slots[r, SHARDED]
    mine = (row[:300] >= 0).nonzero().flatten()
    row[mine[6]] = row[mine[5]]
    fails, _ = judge(world, g)
    assert ("dense-local", "v2") in fails and ("no-collision", "v2") in fails


def test_offset_past_block_size(world):
    """slot % B wraps into the next block: caught even when the block id happens to exist."""
    g, G = broken(world)
    r = _owner(world, 0)
    row = G.slots[r, SHARDED]
    t = int((row[:300] >= 0).nonzero().flatten()[3])
    row[t] = row[t] + 32  # B = 32: same offset, next physical block id
    fails, _ = judge(world, g)
    assert ("dense-local", "v2") in fails


def test_collision_across_requests(world):
    g, G = broken(world)
    # Request 2 (positions 90..92) on its owner rank takes a slot of request 0 on that rank.
    t = 301 + 1  # second token of request 2
    r = _owner(world, t)
    donor = int((G.slots[r, SHARDED, :300] >= 0).nonzero().flatten()[0])
    G.slots[r, SHARDED, t] = G.slots[r, SHARDED, donor]
    fails, verdicts = judge(world, g)
    assert ("no-collision", "v2") in fails


def test_slot_outside_cache(world):
    g, G = broken(world)
    r = _owner(world, 0)
    G.slots[r, SHARDED, 0] = 256 * 32 + 5
    fails, _ = judge(world, g)
    assert ("no-collision", "v2") in fails


def test_stale_tail(world):
    g, G = broken(world)
    G.slots[:, SHARDED, 310] = 1234  # between the scheduled tokens and the padded count
    fails, _ = judge(world, g)
    assert ("padding", "v2") in fails


def test_poison_left_behind(world):
    g, G = broken(world)
    G.slots[2, UNSHARDED, 200] = POISON
    fails, _ = judge(world, g)
    assert ("padding", "v2") in fails


def test_mamba_group_must_be_pad_in_v2(world):
    g, G = broken(world)
    G.slots[0, MAMBA, 3] = 77
    fails, _ = judge(world, g)
    assert ("matches-reference", "v2") in fails


def test_undersized_table(world):
    g, G = broken(world)
    G.widths[:, SHARDED] -= 1
    fails, _ = judge(world, g)
    assert ("block-sizing", "v2") in fails


def test_table_not_divided_by_cp(world):
    g, G = broken(world, "v1")
    G.widths[:, SHARDED] *= 4
    fails, _ = judge(world, g)
    assert ("block-sizing", "v1") in fails


def test_unsharded_table_divided_by_cp(world):
    g, G = broken(world, "v1")
    G.widths[:, MAMBA] //= 4
    fails, _ = judge(world, g)
    assert ("block-sizing", "v1") in fails


def test_short_buffer(world):
    g, G = broken(world, "v1")
    G.slots = G.slots[:, :, :300]
    fails, _ = judge(world, g)
    assert ("capacity", "v1") in fails
    assert ("exactly-one-owner", "v1") in fails  # the tokens past the buffer are on no rank


def test_reference_mismatch(world):
    """Swap two tokens' slots on one rank: ownership and collisions still look fine."""
    g, G = broken(world)
    r = _owner(world, 0)
    row = G.slots[r, SHARDED]
    a, b = (row[:300] >= 0).nonzero().flatten()[:2].tolist()
    row[a], row[b] = row[b].clone(), row[a].clone()
    fails, _ = judge(world, g)
    assert ("matches-reference", "v2") in fails
    assert ("no-collision", "v2") not in fails and ("exactly-one-owner", "v2") not in fails


def test_paths_disagree(world):
    g, G = broken(world, "v1-torch")
    G.slots[1, RING, 0] = G.slots[1, RING, 0] + 1
    fails, _ = judge(world, g)
    assert ("paths-agree", "v1~v1-torch") in fails
    assert ("paths-agree", "v1~v2") not in fails


def test_unsharded_token_missing_on_one_rank(world):
    g, G = broken(world)
    G.slots[3, UNSHARDED, 7] = PAD_SLOT_ID
    fails, _ = judge(world, g)
    assert ("exactly-one-owner", "v2") in fails


def test_ring_overwrites_only_within_a_request(world):
    g, G = broken(world)
    # Within request 0 the ring reuses slots by design: positions 0 and 16 share one.
    assert int(G.slots[0, RING, 0]) == int(G.slots[0, RING, 16])
    fails, _ = judge(world, g)
    assert ("no-collision", "v2") not in fails
    # Across requests it must not: request 1 takes a slot of request 0.
    G.slots[:, RING, 300] = G.slots[:, RING, 0]
    fails, _ = judge(world, g)
    assert ("no-collision", "v2") in fails


def test_different_scenarios_on_ranks(world):
    s = world[0]
    fails, verdicts = judge(world, fingerprints=[s.fingerprint()] * 3 + ["0" * 16])
    assert ("same-scenario", "*") in fails
    vio = next(v for v in verdicts if v.invariant == "same-scenario").violations[0]
    assert vio.ranks == [3]


def test_violation_carries_examples(world):
    g, G = broken(world)
    r = _owner(world, 10)
    G.slots[r, SHARDED, 10] = PAD_SLOT_ID
    _, verdicts = judge(world, g)
    v = next(v for v in verdicts if v.invariant == "owner-rule" and v.path == "v2")
    vio = v.violations[0]
    assert vio.group == "attn" and vio.count == 1 and vio.ranks == [r]
    assert vio.examples[0].position == 10 and vio.examples[0].request == 0

"""Each invariant, fed a mapping broken the way it guards against, must fail."""

import copy

import pytest
import torch

from cpsim.check import coordinator
from cpsim import scenario as sc
from cpsim.allocator import allocate_world
from cpsim.layout import PAD_SLOT_ID, POISON, owner_rank
from cpsim.run.world import run_virtual
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

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
    gathered = run_virtual(s, ["v1", "v1-torch", "v2"], runner=RUNNER)
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
    # nothing replays here; inputs-intact and kernel-output judge a user's kernel only (tests/test_hostile_kernel.py)
    ran_for_users = {"inputs-intact", "kernel-output"}
    assert ran == set(coordinator.INVARIANTS) - {"replayed-is-pad"} - ran_for_users
    assert {v.status for v in verdicts if v.invariant in {"replayed-is-pad", *ran_for_users}} == {"n/a"}


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


# ---- prefix-cache replay: replayed positions are PAD in the prefix-cacheable groups ----

CACHEABLE, LOCAL, REPLAYING, TAIL = 0, 1, 2, 3


@pytest.fixture(scope="module")
def replay_world():
    """CP 4. Request 0 re-runs [32, 48) in its second chunk (positions 40..99), request 2 is all replayed."""
    s = sc.Scenario(
        "coord-replay", sc.CPConfig(dcp=4, interleave=8),
        (sc.KVGroup("attn", block_size=32, kernel_block_size=16, num_blocks=256),
         sc.KVGroup("local", block_size=16, cp_sharded=False, num_blocks=256),
         sc.KVGroup("swa", kind="sliding_window", block_size=16, cp_sharded=False, num_blocks=64,
                    prefix_cacheable=False, prefix_replay_tokens=16),
         sc.KVGroup("tail", block_size=16, num_blocks=256, prefix_cacheable=False),
         sc.KVGroup("state", kind="mamba", block_size=32, cp_sharded=False, num_blocks=64)),
        sc.Limits(max_model_len=2048, max_num_reqs=4, max_num_batched_tokens=128),
        sc.Batch((sc.Request(40, 60, "replay", replay_start=32), sc.Request(0, 20),
                  sc.Request(200, 10, "replay", replay_start=200)), (2, 0, 3)), seed=3)
    s = sc.validate(s)
    return s, allocate_world(s), run_virtual(s, ["v1", "v2"], runner=RUNNER)


REPLAYED = list(range(0, 8)) + list(range(80, 90))  # token indices at replayed positions


def test_replay_world_passes_everything(replay_world):
    s = replay_world[0]
    assert sorted(s.replay_mask().nonzero()[0].tolist()) == REPLAYED
    fails, verdicts = judge(replay_world)
    assert fails == set()
    assert {v.status for v in verdicts if v.invariant == "replayed-is-pad"} == {"pass"}
    G = replay_world[2]["v2"]
    assert bool((G.slots[:, CACHEABLE, REPLAYED] == PAD_SLOT_ID).all())
    assert bool((G.slots[:, REPLAYING, REPLAYED] != PAD_SLOT_ID).all())  # replicated: every rank writes


def test_replayed_slot_left_real(replay_world):
    g, G = broken(replay_world)
    G.slots[1, LOCAL, 83] = G.slots[1, LOCAL, 10]  # a plausible slot of the request: not PAD
    fails, verdicts = judge(replay_world, g)
    assert ("replayed-is-pad", "v2") in fails and ("matches-reference", "v2") in fails
    vio = next(v for v in verdicts if v.invariant == "replayed-is-pad" and v.path == "v2").violations[0]
    assert vio.group == "local" and vio.ranks == [1] and vio.examples[0].position == 203


def test_replayed_slot_left_real_on_the_owner_of_a_sharded_group(replay_world):
    g, G = broken(replay_world, "v1")
    s = replay_world[0]
    pos = int(s.batch.positions()[5])
    r = owner_rank(pos, 4, 8)
    G.slots[r, CACHEABLE, 5] = 4242
    fails, _ = judge(replay_world, g)
    assert ("replayed-is-pad", "v1") in fails
    assert ("exactly-one-owner", "v1") not in fails  # replayed tokens are not ownership's to judge here


def test_non_cacheable_group_padded(replay_world):
    """Padding the wrong groups: the group that left prefix caching must keep its replayed writes."""
    g, G = broken(replay_world)
    G.slots[:, REPLAYING, REPLAYED] = PAD_SLOT_ID
    fails, verdicts = judge(replay_world, g)
    assert ("replayed-is-pad", "v2") in fails
    vio = next(v for v in verdicts if v.invariant == "replayed-is-pad" and v.path == "v2").violations[0]
    assert vio.group == "swa" and vio.count == 4 * len(REPLAYED) and vio.ranks == [0, 1, 2, 3]


def test_sharded_non_cacheable_group_padded_on_its_owner(replay_world):
    g, G = broken(replay_world)
    s = replay_world[0]
    t = 84
    r = owner_rank(int(s.batch.positions()[t]), 4, 8)
    G.slots[:, TAIL, t] = PAD_SLOT_ID  # the other ranks hold PAD there anyway
    fails, verdicts = judge(replay_world, g)
    assert ("replayed-is-pad", "v2") in fails
    vio = next(v for v in verdicts if v.invariant == "replayed-is-pad" and v.path == "v2").violations[0]
    assert vio.group == "tail" and vio.count == 1 and vio.ranks == [r]


def test_replay_window_overrun_is_caught_by_ownership(replay_world):
    """A pass that also pads the first position after the window takes a token from its owner."""
    g, G = broken(replay_world)
    G.slots[:, CACHEABLE, 8] = PAD_SLOT_ID  # position 48 = replay_start + window: new KV
    fails, _ = judge(replay_world, g)
    assert ("exactly-one-owner", "v2") in fails and ("owner-rule", "v2") in fails
    assert ("replayed-is-pad", "v2") not in fails



@pytest.mark.parametrize("gi", [SHARDED, RING])
def test_no_collision_names_exactly_the_slots_held_twice(world, gi):
    """no-collision against a count by hand, on random slot arrays (repeats, PAD, unwritten entries,
    slots outside the cache); in the ring group a request may reuse its own slots."""
    import collections

    import numpy as np
    from hypothesis import given, settings, strategies as st
    s = world[0]
    g = s.groups[gi]
    ctx = coordinator._Ctx(s, world[1])
    cap = g.num_blocks * g.block_size
    specials = np.array([PAD_SLOT_ID, coordinator.MISSING, -5, cap, cap + 3], dtype=np.int64)

    # Hypothesis draws the seed, numpy the 3 x n array from it (a list strategy of ~900 values cost 0.1 s an
    # example): half slots 0-40 (so repeats), half PAD, unwritten, negative or outside the cache.
    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.integers(0, 2**32 - 1))
    def check(seed):
        rng = np.random.default_rng(seed)
        x = np.where(rng.random((3, ctx.n)) < 0.5, rng.integers(0, 41, (3, ctx.n)),
                     specials[rng.integers(0, specials.size, (3, ctx.n))])
        want = []
        for r in range(3):
            held = [(int(ctx.req[t]), int(v)) for t, v in enumerate(x[r]) if v not in (PAD_SLOT_ID, coordinator.MISSING)]
            outside = [v for _, v in held if not 0 <= v < cap]
            if outside:
                want.append((r, "outside", len(outside)))
            counts = collections.Counter(v for _, v in (set(held) if g.circular else held))
            twice = [v for v, c in counts.items() if c > 1]
            if twice:
                want.append((r, "more than one token", len(twice)))
        got = [(v.ranks[0], "outside" if "outside" in v.message else "more than one token", v.count)
               for v in coordinator.no_collision(ctx, "v2", g, x)]
        assert got == want

    check()


def test_a_buffer_an_earlier_path_had_gets_the_verdicts_it_gets_alone():
    """``check`` judges a group's buffer once when a later path hands in the same one (the fast path in
    ``coordinator.check``). On drawn scenarios with buffers equal, corrupted alike or corrupted apart
    (slots read from a table's guard entries among the corruptions) and table entry sizes that may
    differ, every path's verdicts are the ones it gets checked alone, where nothing is reused."""
    from hypothesis import HealthCheck, given, settings, strategies as st
    from cpsim.check import reference
    from cpsim.check.gathered import Gathered
    from cpsim.fuzz import scenarios
    from cpsim.layout import table_guard_id

    paths = ["v1", "v2", "v1-torch"]

    @settings(max_examples=80, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(scenarios(max_programs=12), st.data())
    def prop(s, data):
        allocs = allocate_world(s)
        n = s.limits.slot_buffer_size
        ref = torch.stack([reference.rank_slots(s, allocs[r], r, n) for r in range(s.cp.world)])
        ranks, groups = ref.shape[0], ref.shape[1]
        guard_slots = [table_guard_id(g.num_blocks, g.block_size, e) * e for g in s.groups for e in (g.b, g.block_size)]
        values = st.sampled_from([PAD_SLOT_ID, POISON, -5, 0, 1, 17, 2**31, *guard_slots])
        gathered, first = {}, None
        for i, p in enumerate(paths):
            how = data.draw(st.sampled_from(["reference", "broken"] + ["as the first"] * 2 * (i > 0)))
            slots = ref.clone() if how != "as the first" else first.clone()
            if how == "broken":
                for _ in range(data.draw(st.integers(1, 4))):
                    at = data.draw(st.integers(0, slots.numel() - 1))
                    other = int(slots.view(-1)[data.draw(st.integers(0, slots.numel() - 1))])
                    slots.view(-1)[at] = data.draw(st.one_of(values, st.just(other)))
            first = slots if first is None else first
            sizes = [[data.draw(st.sampled_from([g.b, g.block_size])) for g in s.groups]] * ranks
            enabled = [[data.draw(st.sampled_from([True] * 4 + [False])) for _ in s.groups]] * ranks
            gathered[p] = Gathered(p, slots, torch.tensor(enabled), torch.full((ranks, groups), 4096),
                                   torch.tensor(sizes, dtype=torch.int64))
        fps = [s.fingerprint()] * s.cp.world
        together = [v for v in coordinator.check(s, allocs, gathered, fps) if v.path in paths]
        alone = [v for p in paths for v in coordinator.check(s, allocs, {p: gathered[p]}, fps) if v.path == p]
        assert together == alone

    prop()

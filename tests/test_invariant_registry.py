"""Every invariant the oracle runs (``coordinator.ORACLE``) fails on a mapping broken the way it guards
against: a table of one broken mapping per registered name, so an invariant added without one fails here.
The mappings break the correct worlds of ``test_coordinator`` (CP 4: sharded, unsharded, ring, mamba; and
its prefix-cache replay world for ``replayed-is-pad``)."""

import copy

import pytest
import torch

from cpsim.check import coordinator
from cpsim.layout import GUARD, PAD_SLOT_ID, table_guard_id
from cpsim.paths.types import KernelFailure
from test_coordinator import SHARDED, UNSHARDED, _owner, judge, replay_world, world  # noqa: F401  (fixtures)


def _slot(G, world, t=10):
    """(rank, slot) of token ``t`` in the sharded group, on its owner."""
    r = _owner(world, t)
    return r, int(G.slots[r, SHARDED, t])


def _completes(G, world):
    G.failures = [KernelFailure("v2", 1, "raised", "kernel raised ValueError on rank 1")]


def _guard_intact(G, world):
    G.guards = torch.full((4, 4, 8), GUARD, dtype=torch.int64)
    G.guards[2, SHARDED, 5] = 0


def _inputs_intact(G, world):
    G.written = torch.zeros((4, 4, 4), dtype=torch.int64)
    G.written[1, SHARDED, 0] = 3


def _kernel_output(G, world):
    G.output_faults = torch.zeros((4, 4), dtype=torch.int64)
    G.output_faults[0, SHARDED] = 3


def _row_bounds(G, world):
    g = world[0].groups[SHARDED]
    e = int(G.entry_sizes[0, SHARDED])
    G.slots[_owner(world, 10), SHARDED, 10] = table_guard_id(g.num_blocks, g.block_size, e) * e


def _exactly_one_owner(G, world):
    r, slot = _slot(G, world)
    G.slots[(r + 1) % 4, SHARDED, 10] = slot + 1000


def _owner_rule(G, world):
    r, slot = _slot(G, world)
    G.slots[(r + 1) % 4, SHARDED, 10], G.slots[r, SHARDED, 10] = slot, PAD_SLOT_ID


def _replicas_agree(G, world):
    G.slots[3, UNSHARDED, 7] = G.slots[3, UNSHARDED, 7] + 1


def _dense_local(G, world):
    r, slot = _slot(G, world)
    G.slots[r, SHARDED, 10] = slot + 32  # same offset, the next block id


def _no_collision(G, world):
    r, _ = _slot(G, world)
    G.slots[r, SHARDED, 10] = 256 * 32 + 5  # past the cache


def _block_sizing(G, world):
    G.widths[:, SHARDED] -= 1


def _capacity(G, world):
    G.slots = G.slots[:, :, :300]


def _padding(G, world):
    G.slots[:, SHARDED, 310] = 1234


def _replayed_is_pad(G, world):
    """In ``replay_world``: a replayed token of its prefix-cacheable unsharded group keeps a real slot."""
    G.slots[1, 1, 83] = G.slots[1, 1, 10]


def _matches_reference(G, world):
    r = _owner(world, 0)
    row = G.slots[r, SHARDED]
    a, b = (row[:300] >= 0).nonzero().flatten()[:2].tolist()
    row[a], row[b] = row[b].clone(), row[a].clone()


def _paths_agree(G, world):
    G.slots[1, 2, 0] = G.slots[1, 2, 0] + 1


BROKEN = {
    "kernel-completes": _completes, "guard-intact": _guard_intact, "inputs-intact": _inputs_intact,
    "kernel-output": _kernel_output, "row-bounds": _row_bounds, "exactly-one-owner": _exactly_one_owner,
    "owner-rule": _owner_rule, "replicas-agree": _replicas_agree, "dense-local": _dense_local,
    "no-collision": _no_collision, "block-sizing": _block_sizing, "capacity": _capacity, "padding": _padding,
    "replayed-is-pad": _replayed_is_pad, "matches-reference": _matches_reference, "paths-agree": _paths_agree,
    "same-scenario": None,  # the fingerprints, not the mapping: rank 3 built another scenario
}


@pytest.mark.parametrize("name", coordinator.INVARIANTS)
def test_each_registered_invariant_fails_on_its_broken_mapping(request, name):
    assert name in BROKEN, f"invariant {name} is registered in coordinator.ORACLE without a broken mapping here"
    w = request.getfixturevalue("replay_world" if name == "replayed-is-pad" else "world")
    gathered = copy.deepcopy(w[2])
    fingerprints = [w[0].fingerprint()] * 3 + ["0" * 16] if name == "same-scenario" else None
    if BROKEN[name] is not None:
        BROKEN[name](gathered["v2"], w)
    fails, _ = judge(w, gathered, fingerprints)
    want = ("paths-agree", "v1~v2") if name == "paths-agree" else (name, "*" if name == "same-scenario" else "v2")
    assert want in fails

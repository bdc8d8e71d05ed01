"""The presets that reach upstream's real triggers (issue 28, item 4): each passes with cpsim's own
kernels, and each catches the catalogue fault it is there for, through the invariant that fault breaks."""

import pytest

from cpsim import faults
from cpsim import scenario as sc
from cpsim.presets import preset
from cpsim.faults import detect
from cpsim.allocator import allocate_world
from cpsim.paths import Knobs
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

# preset -> (fault, path it is judged on, an invariant that must fail). The torch path where the fault
# reaches it (no interpreter), else the fewest interpreter programs.
TARGETS = [
    ("hybrid-interleave", "virtual-block-uses-kernel-block", "v1-torch", "owner-rule"),
    ("hybrid-interleave", "virtual-block-uses-kernel-block", "v2", "owner-rule"),
    ("long-context", "fixed-table-window", "v1", "dense-local"),
    ("huge-cache", "fp32-block-gather", "v1", "dense-local"),
    ("huge-cache", "int32-slot-overflow", "v1", "no-collision"),
    ("released-window", "cp-applied-to-unsharded-groups", "v2", "exactly-one-owner"),
    ("released-window", "stale-tail", "v1-torch", "padding"),
    ("released-window", "padded-count-tail", "v2", "padding"),
]
NEW = sorted({p for p, *_ in TARGETS})


def _failed(r: detect.Run) -> set[str]:
    return {v.invariant for v in r.verdicts if v.status == "fail"}


@pytest.mark.parametrize("name", NEW)
def test_trigger_preset_passes_with_builtin_kernels(name):
    s = sc.validate(preset(name))
    r = detect.run(s, Knobs(), ("v1", "v1-torch", "v2"), runner=RUNNER)
    assert not r.failed, _failed(r)


@pytest.mark.parametrize("name, fault, path, invariant", TARGETS)
def test_trigger_preset_catches_its_fault(name, fault, path, invariant):
    s = sc.validate(preset(name))
    f = faults.get(fault)
    r = detect.run(s, f.knobs_for(s), (path,), runner=RUNNER)
    assert invariant in _failed(r), (fault, _failed(r))


def test_trigger_presets_reach_their_corners():
    """What each preset is for holds of its data: I > b under CP, table index >= 4096, ids past 2^24 and
    slots past 2^31 in use, a replicated slot-mapped group under DCP with graph padding."""
    s = preset("hybrid-interleave")
    assert s.cp.world > 1 and all(g.bpk > 1 and s.cp.interleave > g.b for g in s.groups)
    s = preset("long-context")
    g = s.groups[0]
    assert max(r.seq_len for r in s.batch.requests) > 4096 * g.block_size * g.world(s.cp)
    s = preset("huge-cache")
    ids = [int(b.max()) * g.bpk for row in allocate_world(s) for g, a in zip(s.groups, row) for b in a.blocks
           if len(b)]
    assert max(ids) > 2**24
    assert any((int(b.max()) + 1) * g.block_size > 2**31 for row in allocate_world(s)
               for g, a in zip(s.groups, row) for b in a.blocks if len(b))
    s = preset("released-window")
    assert s.cp.world > 1 and s.batch.num_tokens_padded > s.batch.num_tokens
    assert any(g.kind == "attention" and g.world(s.cp) == 1 for g in s.groups)


def test_huge_cache_allocation_stays_sparse():
    """2^26-block caches: the allocator hands out ids without materialising the cache (numpy's
    sparse draw), so the world's allocations stay the size of the batch."""
    import tracemalloc
    s = preset("huge-cache")
    tracemalloc.start()
    allocate_world(s)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 16 << 20, peak  # a dense draw of 2^26 int64 ids alone is 512 MiB


@pytest.mark.parametrize("abi", ["ascend-v1", "ascend-v2", "ascend-v2-0.18"])
def test_huge_cache_slots_are_inexpressible_for_int32_output_abis(abi):
    """vllm-ascend's kernels write int32 slots: huge-cache's slots past 2^31 are a limit of their contract,
    not a finding (the matrix leaves the cell out); a vLLM ABI writing int64 is judged there."""
    s = sc.validate(preset("huge-cache"))
    assert "int32 slots" in detect.representable(s, "v1", {"v1": {"spec": "k.py:k", "abi": abi}})
    assert detect.representable(s, "v1", {"v1": {"spec": "k.py:k", "abi": "vllm-mrv2-0.32"}}) == ""
    assert detect.representable(sc.validate(preset("default")), "v1", {"v1": {"spec": "k.py:k", "abi": abi}}) == ""

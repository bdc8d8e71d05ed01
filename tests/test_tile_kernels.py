"""The tile-parallel kernels compute exactly what the per-request kernels and the reference do.

Run on the Triton interpreter. Equality with the per-request kernels is checked
entry by entry over the whole buffer (padding and poison included); equality
with the reference and every other invariant through the coordinator.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cpsim.check import coordinator

from cpsim import kernels
from cpsim import scenario as sc
from cpsim.presets import preset
from cpsim.random_scenarios import random_scenario
from cpsim.allocator import allocate_world
from cpsim.paths import Knobs
from cpsim.run.world import run_virtual
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

kernels.use_interpreter()

TILE = Knobs(kernel_design="tile")
KERNEL_PATHS = ["v1", "v1-fused", "v2"]


def _check(s: sc.Scenario, paths, knobs: Knobs = TILE, inject_rank=None):
    g = run_virtual(s, paths, knobs, inject_rank, runner=RUNNER)
    return g, coordinator.check(s, allocate_world(s), g, [s.fingerprint()] * s.cp.world)


def _failed(verdicts) -> set[str]:
    return {v.invariant for v in verdicts if v.status == "fail"}


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for p in a:
        assert torch.equal(a[p].slots, b[p].slots), f"{p}: tile differs from per-request"
        assert torch.equal(a[p].enabled, b[p].enabled)


@pytest.mark.parametrize("seed", range(14))
def test_random_scenarios_equal_per_request_and_reference(seed):
    s = random_scenario(seed)
    tile, verdicts = _check(s, KERNEL_PATHS)
    assert coordinator.passed(verdicts), _failed(verdicts)
    assert any(v.invariant == "matches-reference" and v.status == "pass" for v in verdicts)
    _same(run_virtual(s, KERNEL_PATHS, runner=RUNNER), tile)


@pytest.mark.parametrize("name", ["default", "hybrid-mamba", "mtp"])
def test_presets_equal_per_request(name):
    s = preset(name)
    tile, verdicts = _check(s, KERNEL_PATHS + ["v1-torch"])
    assert coordinator.passed(verdicts), _failed(verdicts)
    _same(run_virtual(s, KERNEL_PATHS, runner=RUNNER), {p: tile[p] for p in KERNEL_PATHS if p in tile})


@pytest.mark.parametrize("name", ["decode-heavy"])
def test_large_presets_match_reference(name):
    # The per-request kernels are slow on the interpreter here; the reference and
    # the torch path (paths-agree) are the comparison. long-prefill (8 ranks x 128K
    # tokens) is left to scripts/bench_coordinator.py, which runs it with --kernel-design tile.
    s = preset(name)
    _, verdicts = _check(s, ["v1", "v2", "v1-torch"])
    assert coordinator.passed(verdicts), _failed(verdicts)
    assert {v.path for v in verdicts if v.invariant == "paths-agree"} == {"v1~v2", "v1~v1-torch"}


def _one_group(B: int, b: int = 0, cp: int = 1, interleave: int = 1, num_blocks: int = 4096,
               requests=((0, 40), (300, 1), (90, 7)), mml: int = 4096, padded: int = 0,
               kind: str = "attention") -> sc.Scenario:
    reqs = tuple(sc.Request(c, q) for c, q in requests)
    total = sum(q for _, q in requests)
    limits = sc.Limits(max_model_len=mml, max_num_reqs=len(reqs) + 2, max_num_batched_tokens=total + 16)
    g = sc.KVGroup("g", kind, B, b, cp_sharded=kind == "attention", num_blocks=num_blocks)
    return sc.validate(sc.Scenario("t", sc.CPConfig(dcp=cp, interleave=interleave), (g,), limits,
                                   sc.Batch(reqs, num_tokens_padded=padded)))


def test_dummies_and_empty_requests():
    base = preset("default")
    reqs = (sc.Request(0, 0, "dummy"),) + base.batch.requests[:-1] + (sc.Request(0, 0), sc.Request(0, 0, "dummy"))
    free = min(set(range(base.limits.max_num_reqs)) - set(base.batch.idx_mapping))
    rows = (-1,) + base.batch.idx_mapping[:-1] + (free, -1)
    s = sc.validate(base.replace(batch=sc.Batch(reqs, rows, base.batch.num_tokens_padded)))
    tile, verdicts = _check(s, ["v2"])
    assert coordinator.passed(verdicts), _failed(verdicts)
    _same(run_virtual(s, ["v2"], runner=RUNNER), tile)


def test_no_requests_pads_everything():
    s = _one_group(16, requests=())
    tile, verdicts = _check(s, ["v1", "v2"])
    assert coordinator.passed(verdicts), _failed(verdicts)
    assert bool((tile["v2"].slots == -1).all())


def test_more_tiles_than_one(monkeypatch):
    """Force many small tiles so requests straddle tile borders."""
    from cpsim.kernels import tile as tile_mod

    monkeypatch.setattr(tile_mod, "CPU_TILE", 16)
    s = _one_group(64, 32, cp=2, interleave=8, padded=90,
                   requests=((0, 37), (500, 1), (0, 0), (64, 16), (1000, 5), (7, 19)))
    tile, verdicts = _check(s, KERNEL_PATHS)
    assert coordinator.passed(verdicts), _failed(verdicts)
    _same(run_virtual(s, KERNEL_PATHS, runner=RUNNER), tile)


# ---- the bug catalogue's FAULT bits behave as in the per-request kernels ------

FAULT_CASES = {
    # bit: (scenario, invariant the fault must break)
    kernels.FAULT_STALE_TAIL: (lambda: _one_group(16, padded=60), "padding"),
    kernels.FAULT_FIXED_WINDOW: (lambda: _one_group(16, mml=131072, num_blocks=8192,
                                                    requests=((100000, 3), (0, 5))),
                                 "matches-reference"),
    kernels.FAULT_FP32_GATHER: (lambda: _one_group(128, num_blocks=2**25 + 64), "matches-reference"),
    kernels.FAULT_INT32_SLOT: (lambda: _one_group(256, num_blocks=2**24, requests=((0, 300),) * 4),
                               "matches-reference"),
    kernels.FAULT_FULL_CP: (lambda: preset("hybrid-mamba"), "matches-reference"),
}


@pytest.mark.parametrize("bit", sorted(FAULT_CASES))
def test_fault_bits_reproduce_the_per_request_bug(bit):
    make, invariant = FAULT_CASES[bit]
    s = make()
    paths = ["v2"] if bit == kernels.FAULT_FULL_CP else ["v1", "v2"]
    faulty = Knobs(kernel_fault=bit)
    tile, verdicts = _check(s, paths, dataclasses.replace(faulty, kernel_design="tile"))
    assert invariant in _failed(verdicts)
    _same(run_virtual(s, paths, faulty, runner=RUNNER), tile)


def test_fault_on_one_rank_keeps_design_on_the_others():
    s = _one_group(16, cp=2, interleave=4, padded=60)
    knobs = Knobs(kernel_fault=kernels.FAULT_STALE_TAIL, kernel_design="tile")
    tile, _ = _check(s, ["v2"], knobs, inject_rank=1)
    ref = run_virtual(s, ["v2"], Knobs(kernel_fault=kernels.FAULT_STALE_TAIL), inject_rank=1, runner=RUNNER)
    _same(ref, tile)


def test_int32_positions_only_when_provable():
    from cpsim.kernels.tile import plan

    assert plan(256, 16, 2**31 - 1, "cuda").pos_int32
    assert not plan(256, 16, 2**31, "cuda").pos_int32
    assert plan(1 << 20, 16, 1 << 20, "cuda").grid(1 << 20) == plan(1 << 20, 1, 2048, "cuda").grid(1 << 20)


def test_unknown_design_is_a_config_error():
    from cpsim.errors import ConfigError

    with pytest.raises(ConfigError, match="kernel_design"):
        Knobs(kernel_design="warp")


@pytest.mark.parametrize("B", [48, 64])
def test_fused_and_v2_with_and_without_shift_path(B):
    """Non-power-of-two block sizes take the division path, powers of two the shifts."""
    s = _one_group(B, requests=((0, 50), (200, 3), (0, 0), (97, 1)), padded=70)
    s = s.replace(groups=s.groups + (sc.KVGroup("swa", "sliding_window", 32, cp_sharded=False, num_blocks=16),))
    s = sc.validate(s)
    tile, verdicts = _check(s, KERNEL_PATHS)
    assert coordinator.passed(verdicts), _failed(verdicts)
    _same(run_virtual(s, KERNEL_PATHS, runner=RUNNER), tile)

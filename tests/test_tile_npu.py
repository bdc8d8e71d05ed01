"""The Ascend tile kernels (``cpsim.kernels.tile_npu``) compute exactly what the per-request kernels do.

Run on the Triton interpreter with the NPU launch plan (a persistent grid smaller
than the number of tiles, so every program walks several tiles); compared entry by
entry with the per-request kernels over the whole buffer, and through the coordinator.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from cpsim import kernels
from cpsim import scenario as sc
from cpsim.presets import preset
from cpsim.random_scenarios import random_scenario
from cpsim.allocator import allocate_world
from cpsim.check import coordinator
from cpsim.paths import Knobs
from cpsim.run.world import run_virtual

kernels.use_interpreter()
kernels.import_triton()
import triton  # noqa: E402  (after TRITON_INTERPRET=1)
import triton.language as tl  # noqa: E402

from cpsim.kernels._common import gather_i32  # noqa: E402
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

TILE = Knobs(kernel_design="tile")
PATHS = ["v1", "v1-fused", "v2"]


@pytest.fixture
def npu_design(monkeypatch):
    """Launch the NPU kernels with an NPU-style plan: 64-token tiles, at most 3 programs."""
    from cpsim.kernels import select, tile
    from cpsim.paths import tile_launch

    def plan(s, max_num_tokens, device):
        p = tile.plan(max_num_tokens, s.limits.max_num_reqs, s.limits.max_model_len, "cpu", tile=64)
        return dataclasses.replace(p, max_programs=3)

    monkeypatch.setattr(tile_launch, "tile_kernels", lambda device_type: select.tile_kernels("npu"))
    monkeypatch.setattr(tile_launch, "_plan", plan)


def _check(s, paths, knobs=TILE):
    g = run_virtual(s, paths, knobs, runner=RUNNER)
    return g, coordinator.check(s, allocate_world(s), g, [s.fingerprint()] * s.cp.world)


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for p in a:
        assert torch.equal(a[p].slots, b[p].slots), f"{p}: NPU tile kernel differs from per-request"


@pytest.mark.parametrize("seed", range(6))
def test_random_scenarios_equal_per_request(seed, npu_design):
    s = random_scenario(seed)
    tile, verdicts = _check(s, PATHS)
    assert coordinator.passed(verdicts), {v.invariant for v in verdicts if v.status == "fail"}
    _same(run_virtual(s, PATHS, runner=RUNNER), tile)


@pytest.mark.parametrize("name", ["default", "hybrid-mamba"])
def test_presets_equal_per_request(name, npu_design):
    s = preset(name)
    tile, verdicts = _check(s, PATHS)
    assert coordinator.passed(verdicts)
    _same(run_virtual(s, PATHS, runner=RUNNER), tile)


def test_large_block_ids_stay_exact_and_fp32_fault_still_breaks_them(npu_design):
    g = sc.KVGroup("g", "attention", 128, 0, cp_sharded=True, num_blocks=2**25 + 64)
    s = sc.validate(sc.Scenario("t", sc.CPConfig(dcp=1), (g,),
                                sc.Limits(max_model_len=4096, max_num_reqs=5, max_num_batched_tokens=64),
                                sc.Batch((sc.Request(0, 40), sc.Request(300, 1)))))
    assert max(int(b.max()) for b in allocate_world(s)[0][0].blocks if len(b)) > 2**24
    tile, verdicts = _check(s, ["v1", "v2"])
    assert coordinator.passed(verdicts)
    _, verdicts = _check(s, ["v1", "v2"], dataclasses.replace(TILE, kernel_fault=kernels.FAULT_FP32_GATHER))
    assert "matches-reference" in {v.invariant for v in verdicts if v.status == "fail"}


def test_npu_plan_caps_the_grid_at_the_vector_cores(monkeypatch):
    from cpsim.kernels import tile

    monkeypatch.setattr(tile, "npu_vector_cores", lambda: 40)
    p = tile.plan(1 << 20, 16, 1 << 20, "npu")
    assert p.tile == tile.NPU_TILE[1] and p.grid(1 << 20) == (40,)
    assert tile.plan(100, 4, 4096, "npu").grid(100) == (1,)   # 2 tiles of 64 would be 2 programs; 100 -> 128
    assert tile.plan(1 << 20, 16, 1 << 20, "cuda").max_programs == 0


@triton.jit
def _gather_kernel(src_ptr, idx_ptr, out_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(out_ptr + r, gather_i32(tl.load(src_ptr + r), tl.load(idx_ptr + r)))


def test_gather_i32_is_exact_for_every_int32():
    """The fp32-halves gather returns every int32 value unchanged (a single fp32 gather would not)."""
    rng = np.random.default_rng(0)
    vals = np.array([-2**31, -2**31 + 1, -65537, -65536, -1, 0, 1, 65535, 65536, 2**24 + 1, 2**31 - 1]
                    + list(rng.integers(-2**31, 2**31, 64 - 11)), dtype=np.int32)
    src = torch.from_numpy(vals)
    idx = torch.from_numpy(rng.permutation(64).astype(np.int32))
    out = torch.zeros(64, dtype=torch.int32)
    _gather_kernel[(1,)](src, idx, out, N=64)
    assert torch.equal(out, src[idx.long()])
    assert float(np.float32(2**24 + 1)) != 2**24 + 1  # the value a single fp32 gather would round

"""The per-request kernels give the same slots with int32 and with int64 position math.

The paths choose int32 (``POS_INT32``, Ascend's vector unit runs it natively) whenever
``max_model_len < 2**31``; int64 is kept for larger models. Both are compared entry by
entry on the interpreter, and against the reference through the coordinator.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cpsim import kernels
from cpsim.presets import preset
from cpsim.random_scenarios import random_scenario
from cpsim.allocator import allocate_world
from cpsim.check import coordinator
from cpsim.paths import v1
from cpsim.run.world import run_virtual
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

kernels.use_interpreter()

PATHS = ["v1", "v1-fused", "v2"]


def test_int32_only_when_provable():
    s = preset("default")
    assert v1.pos_int32(s)
    assert not v1.pos_int32(s.replace(limits=dataclasses.replace(s.limits, max_model_len=2**31)))


@pytest.mark.parametrize("make", [lambda: preset("default"), lambda: preset("default", dcp=1),
                                  lambda: random_scenario(3)], ids=["default", "cp1", "random3"])
def test_int64_positions_give_the_same_slots(make, monkeypatch):
    s = make()
    narrow = run_virtual(s, PATHS, runner=RUNNER)
    monkeypatch.setattr(v1, "pos_int32", lambda s: False)
    wide = run_virtual(s, PATHS, runner=RUNNER)
    assert narrow.keys() == wide.keys()
    for p in narrow:
        assert torch.equal(narrow[p].slots, wide[p].slots), p
    verdicts = coordinator.check(s, allocate_world(s), wide, [s.fingerprint()] * s.cp.world)
    assert coordinator.passed(verdicts)

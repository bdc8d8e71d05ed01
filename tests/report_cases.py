"""Small scenarios shared by the picture and report tests (fast in the Triton interpreter)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from cpsim import kernels  # noqa: E402
from cpsim.scenario import Batch, CPConfig, KVGroup, Limits, Request, Scenario, validate  # noqa: E402
from cpsim.paths import Knobs  # noqa: E402


def small() -> Scenario:
    """CP 4, interleave 32 > kernel block 16 with B = 64 (hybrid), plus an unsharded ring and a mamba group."""
    return validate(Scenario(
        "small", CPConfig(dcp=4, interleave=32),
        (KVGroup("attn", "attention", 64, 16, num_blocks=64),
         KVGroup("swa", "sliding_window", 32, cp_sharded=False, num_blocks=32),
         KVGroup("mamba", "mamba", 64, cp_sharded=False, num_blocks=16)),
        Limits(max_model_len=1024, max_num_reqs=4, max_num_batched_tokens=512),
        Batch((Request(0, 200, "prefill"), Request(100, 60, "chunked"), Request(300, 1, "decode"),
               Request(0, 5, "prefill-short")), (2, 0, 3, 1), num_tokens_padded=280)))


# virtual-block-uses-kernel-block (SPEC §5): V built from b = 16 instead of B = 64 while I = 32 > b.
VIRTUAL_FROM_KERNEL_BLOCK = Knobs(virtual_from_kernel_block=True)
# stale-tail: padding starts at the padded token count, so entries 266..279 keep the poison.
STALE_TAIL = Knobs(kernel_fault=kernels.FAULT_STALE_TAIL)

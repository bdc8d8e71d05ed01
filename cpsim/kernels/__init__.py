"""Slot-mapping kernels under test: our Triton kernels and the torch DCP path.

Triton is imported lazily, and on CPU only through the interpreter: the
environment variable must be set before the first ``import triton``.
"""

from __future__ import annotations

import os
import sys

from cpsim.errors import ConfigError

# Fault switches a built-in kernel can be compiled with (bit flags, constexpr).
FAULT_NONE = 0
FAULT_STALE_TAIL = 1          # pad from the padded token count, not query_start_loc[num_reqs]
FAULT_FIXED_WINDOW = 2        # one fixed 4096-entry window from the start of the row
FAULT_FP32_GATHER = 4         # block ids pass through float32
FAULT_INT32_SLOT = 8          # block * b + o computed in int32
FAULT_FULL_CP = 16            # v2: CP owner transform applied to every group
FAULT_SHORT_REQ = 32          # v1: a rank owning none of a short request still maps its first token
# MRV2 kernel (cpsim/kernels/mrv2.py) only; FAULT_STALE_TAIL applies there too.
FAULT_GROUP_CP_IGNORED = 64   # a partially replicated group (1 < g < N) sharded with the world size
FAULT_SHARD_IS_CP_RANK = 128  # shard rank taken as cp_rank instead of cp_rank % g
FAULT_VIRTUAL_FROM_WORLD = 256  # virtual block B * N instead of B * g
FAULT_KERNEL_BLOCK_IGNORED = 512  # slot from the physical block size over a kernel-block table
FAULT_PADDING_IGNORED = 1024  # is_padding tokens mapped like real ones
# Replay padding (cpsim/kernels/replay_pad.py and its launcher cpsim/paths/replay_padding.py).
FAULT_REPLAY_OFF_BY_ONE = 2048   # the replayed range taken as (start, start + window]: one late
FAULT_REPLAY_FROM_COMPUTED = 4096  # the window counted from the chunk's first position, not replay_start
FAULT_REPLAY_ALL_GROUPS = 8192   # launcher: every group listed as prefix-cacheable
REPLAY_FAULTS = FAULT_REPLAY_OFF_BY_ONE | FAULT_REPLAY_FROM_COMPUTED | FAULT_REPLAY_ALL_GROUPS
MRV2_FAULTS = (FAULT_GROUP_CP_IGNORED | FAULT_SHARD_IS_CP_RANK | FAULT_VIRTUAL_FROM_WORLD
               | FAULT_KERNEL_BLOCK_IGNORED | FAULT_PADDING_IGNORED)


def use_interpreter() -> None:
    """Run Triton kernels on CPU through the interpreter."""
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError("device", "triton was imported before TRITON_INTERPRET=1 was set; "
                          "set TRITON_INTERPRET=1 in the environment to run kernels on CPU")
    os.environ["TRITON_INTERPRET"] = "1"


def import_triton():
    try:
        import triton  # noqa: F401
    except ImportError:
        raise ConfigError("kernels", "Triton is not importable: install the 'sim' extra "
                          "(pip install -e .[sim]) on CPU/GPU, or triton-ascend on NPU") from None
    return triton


def next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def window_size(tile: int, block_size: int) -> int:
    """Table entries a tile of consecutive positions can touch (vllm-ascend's formula)."""
    return next_pow2(-(-tile // block_size) + 1)

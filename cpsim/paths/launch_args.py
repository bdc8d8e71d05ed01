"""Launch arguments the adapters share: the small tensors, dtypes and notes every ABI's launch is built from."""

from __future__ import annotations

import torch

from cpsim.kernels.under_test import ABIS
from cpsim.paths import v2
from cpsim.paths.prep import PerRank
from cpsim.paths.types import Knobs
from cpsim.scenario import INT32_MAX, KVGroup, Scenario

TILE = 1024
ASCEND_TOTAL_BLOCK_SIZE = 4096  # vllm-ascend 0.18-0.23 AscendBlockTables.compute_slot_mappings passes this


def _i32(values, device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int32, device=device)


def _i64(values, device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64, device=device)


def _ptr_dtype(device: torch.device) -> torch.dtype:
    # vLLM keeps pointer tables as uint64; torch_npu lacks uint64 tensors, so NPU gets int64 (same bits).
    return torch.uint64 if device.type in ("cpu", "cuda") else torch.int64


def _check_int32(k, g: KVGroup) -> None:
    top = g.num_blocks * g.block_size - 1
    if top > INT32_MAX:
        k.note(f"group {g.name}: slots reach {top} but the {k.abi} ABI writes int32 slot mappings; slots past "
               f"2^31-1 cannot be represented (they come back wrapped and are reported as violations)")


def _skip_circular(k, g: KVGroup) -> None:
    k.note(f"group {g.name}: a sliding-window ring table has no flag in this {k.abi} kernel; group not checked")


def _out_dtype(k) -> torch.dtype:
    return torch.int32 if ABIS[k.abi].out_dtype == "int32" else torch.int64


def _physical(s: Scenario, g: KVGroup, alloc, knobs: Knobs, prep: PerRank) -> tuple[torch.Tensor, int]:
    """(v2's table of group ``g``, slots per entry)."""
    shape = v2.table_shape(s, g, knobs)
    return prep.table(alloc, shape), shape.entry_size


def _note_dcp_only(k, s: Scenario) -> None:
    if s.cp.pcp > 1:
        k.note(f"the releases of the {k.abi} ABI shard KV over DCP only: the kernel was handed the DCP size "
               f"{s.cp.dcp} and the DCP rank, as their host does (PCP {s.cp.pcp} does not shard KV; the vLLM "
               f"profiles judge ownership over DCP, cpsim's profile over N = PCP x DCP = {s.cp.world})")

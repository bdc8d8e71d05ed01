"""The v2 path: vLLM ``BlockTables`` (Ascend override) for one rank.

Physical tables per group, rows chosen through ``idx_mapping``, one fused launch.
Mamba groups stay in the launch with ``slot_mapping_enabled = 0`` and get PAD.
"""

from __future__ import annotations

import torch

from cpsim import kernels, layout
from cpsim.allocator import Allocation, logical_table, physical_table
from cpsim.layout import PAD_SLOT_ID
from cpsim.paths import Knobs, RankOutput, _guard, _tile, v1
from cpsim.paths._inputs import batch_tensors, prepare_triton
from cpsim.scenario import KVGroup, Scenario

TILE = 1024


def table_width(s: Scenario, g: KVGroup, knobs: Knobs) -> int:
    n = g.world(s.cp)
    mml = s.limits.max_model_len
    if n > 1 and knobs.sharded_width_undivided:
        n = 1
    if n == 1 and knobs.unsharded_width_per_cp:
        n = s.cp.world
    return layout.table_width(mml, g.block_size, n)


def _table(s: Scenario, g: KVGroup, alloc: Allocation, knobs: Knobs, device) -> tuple[torch.Tensor, int]:
    """(table, slots per entry). The kernel-block fault hands over kernel-block entries."""
    rows = list(s.batch.rows_v2())
    phys = physical_table(alloc, rows, s.limits.max_num_reqs, table_width(s, g, knobs))
    if knobs.virtual_from_kernel_block and g.bpk > 1:
        return _guard.table(logical_table(phys, g.bpk).to(device), rows, g.num_blocks, g.block_size, g.b), g.b
    return _guard.table(phys.to(device), rows, g.num_blocks, g.block_size, g.block_size), g.block_size


def run(s: Scenario, allocs: list[Allocation], rank: int, device: torch.device, knobs: Knobs) -> RankOutput:
    prepare_triton(device)
    from cpsim.kernels.triton_v2 import _compute_slot_mappings_kernel

    bt = batch_tensors(s, device)
    T = knobs.buffer_size or s.limits.slot_buffer_size
    out = _guard.buffer(range(len(s.groups)), T, torch.int64, device)
    tables, entry = zip(*(_table(s, g, a, knobs, device) for g, a in zip(s.groups, allocs)))

    def i32(values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    rows = s.batch.rows_v2()
    args = (min(bt.num_tokens, T), T, i32(rows), bt.query_start_loc.clamp(max=T), bt.positions,
            torch.tensor([t.data_ptr() for t in tables], dtype=torch.int64, device=device),
            torch.tensor([t.stride(0) for t in tables], dtype=torch.int64, device=device),
            i32(list(entry)), out, out.stride(0), rank)
    if knobs.kernel_design == "tile":
        _tile.launch_v2(s, args, i32([int(g.slot_mapped) for g in s.groups]), i32([g.world(s.cp) for g in s.groups]),
                        i32([int(g.circular) for g in s.groups]), out, knobs.kernel_fault)
        return RankOutput(out, [True] * len(s.groups), [t.shape[1] for t in tables], list(entry))
    _compute_slot_mappings_kernel[(len(s.groups), s.batch.num_reqs + 1)](
        *args,
        CP_SIZE=s.cp.world, CP_INTERLEAVE=s.cp.interleave, PAD_ID=PAD_SLOT_ID, TRITON_BLOCK_SIZE=TILE,
        BLOCK_TABLE_WINDOW_SIZE=kernels.window_size(TILE, min(entry)),
        slot_mapping_enabled=i32([int(g.slot_mapped) for g in s.groups]),
        group_cp_sizes=i32([g.world(s.cp) for g in s.groups]),
        is_circular=i32([int(g.circular) for g in s.groups]),
        FAULT=knobs.kernel_fault, POS_INT32=v1.pos_int32(s),
    )
    widths = [t.shape[1] for t in tables]
    return RankOutput(out, [True] * len(s.groups), widths, list(entry))

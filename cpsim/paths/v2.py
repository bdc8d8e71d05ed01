"""The v2 path: vLLM ``BlockTables`` (Ascend override) for one rank.

Tables per group, rows chosen through ``idx_mapping``, one fused launch.

Two kernels serve it. Scenarios the older v2 signature can express (every group at
CP size 1 or N, no is_padding tokens) run the existing kernels over physical tables,
so the catalogue's fault switches and the tile design keep working on them. A
scenario with a partially replicated group (``1 < g < N``) or is_padding tokens runs
the MRV2 kernel (``cpsim/kernels/mrv2.py``, upstream's current signature) over
kernel-block tables with ``num_blocks``: the older kernels have no per-group shard
rank nor a padding mask, and faking them with several launches would hide exactly
the single-launch behaviour under test. Mamba groups get PAD: through
``slot_mapping_enabled = 0`` in the older kernel, through ``num_blocks = 0`` in MRV2.
"""

from __future__ import annotations

import numpy as np
import torch

from cpsim import kernels, sizing
from cpsim.allocator import Allocation
from cpsim.layout import PAD_SLOT_ID
from cpsim.paths import tile_launch, v1
from cpsim.paths._inputs import prepare_triton
from cpsim.paths.prep import PerRank, TableShape
from cpsim.paths.types import Knobs, RankOutput
from cpsim.scenario import KVGroup, Scenario

TILE = 1024


def table_width(s: Scenario, g: KVGroup, knobs: Knobs) -> int:
    """The plugged-in sizing's width (``--sizing``), else cpsim's (:func:`cpsim.sizing.cpsim_width`)."""
    given = sizing.sized_width(knobs.host_sizing, "v2", s, g)
    if given is not None:
        return given
    n = g.world(s.cp)
    mml = s.limits.max_model_len
    if n > 1 and knobs.sharded_width_undivided:
        n = 1
    if n == 1 and knobs.unsharded_width_per_cp:
        n = s.cp.world
    return g.row_blocks or sizing.cpsim_width("v2", mml, g.block_size, n, s.cp.world)


def table_shape(s: Scenario, g: KVGroup, knobs: Knobs) -> TableShape:
    """v2's table of group ``g``: rows through ``idx_mapping``, physical entries (slots per entry
    ``entry_size``). The kernel-block fault hands over kernel-block entries."""
    rows, width, gi = tuple(s.batch.rows_v2()), table_width(s, g, knobs), v1.group_number(s, g)
    if knobs.virtual_from_kernel_block and g.bpk > 1:
        return TableShape(gi, rows, s.limits.max_num_reqs, width, g.bpk, g.num_blocks, g.block_size, g.b)
    return TableShape(gi, rows, s.limits.max_num_reqs, width, 1, g.num_blocks, g.block_size, g.block_size)


def needs_mrv2(s: Scenario, knobs: Knobs = Knobs()) -> bool:
    """The scenario (or an injected MRV2-only fault) needs what only the MRV2 kernel expresses."""
    partial = any(1 < g.world(s.cp) < s.cp.world for g in s.groups)
    tail = any(g.row_blocks for g in s.groups)  # only the MRV2 kernel bounds a read by the row's live blocks
    return partial or tail or s.batch.has_padding or bool(knobs.kernel_fault & kernels.MRV2_FAULTS)


def kernel_table_shape(s: Scenario, g: KVGroup, knobs: Knobs) -> TableShape:
    """MRV2 staging: physical id q becomes kernel blocks q*BPK .. q*BPK+BPK-1."""
    return TableShape(v1.group_number(s, g), tuple(s.batch.rows_v2()), s.limits.max_num_reqs,
                      table_width(s, g, knobs), g.bpk, g.num_blocks, g.block_size, g.b)


def num_blocks_array(s: Scenario, allocs: list[Allocation], widths: list[int]) -> np.ndarray:
    """int32 [groups, max_num_reqs]: live kernel blocks per (group, row), at most the table's width
    ``widths[group]``; 0 for groups without slots."""
    out = np.zeros((len(s.groups), s.limits.max_num_reqs), dtype=np.int32)
    for gi, (g, a) in enumerate(zip(s.groups, allocs)):
        if not g.slot_mapped:
            continue
        for i, row in enumerate(s.batch.rows_v2()):
            if row >= 0 and i < len(a.blocks):
                out[gi, row] = min(len(a.blocks[i]) * g.bpk, widths[gi])
    return out


def num_blocks(s: Scenario, allocs: list[Allocation], tables, device) -> torch.Tensor:
    """``num_blocks_array`` of ``tables`` on ``device``."""
    return torch.from_numpy(num_blocks_array(s, allocs, [t.shape[1] for t in tables])).to(device)


def padding_array(s: Scenario, num_tokens: int) -> np.ndarray:
    """bool [num_tokens (padded)]: the batch's is_padding input, on the host."""
    flags = np.zeros(num_tokens, dtype=bool)
    mask = s.batch.padding_mask()[:num_tokens]
    flags[: mask.size] = mask
    return flags


def padding_flags(s: Scenario, num_tokens: int, device) -> torch.Tensor:
    """bool [num_tokens (padded)]: the batch's is_padding input."""
    return torch.from_numpy(padding_array(s, num_tokens)).to(device)


def _i32(values) -> np.ndarray:
    return np.asarray(list(values), dtype=np.int32)


def _ptrs(tables) -> tuple[np.ndarray, np.ndarray]:
    """int64 (data pointers, row strides) of ``tables``: the per-group table arguments of one launch."""
    return (np.asarray([t.data_ptr() for t in tables], dtype=np.int64),
            np.asarray([t.stride(0) for t in tables], dtype=np.int64))


def run_mrv2(s: Scenario, allocs: list[Allocation], rank: int, prep: PerRank, knobs: Knobs) -> RankOutput:
    """One launch of upstream's current kernel over kernel-block tables."""
    from cpsim.kernels.mrv2 import _compute_slot_mappings_kernel

    T = knobs.buffer_entries(s, "v2")
    out = prep.buffer(range(len(s.groups)), T, torch.int64)
    tables = [prep.table(a, kernel_table_shape(s, g, knobs)) for g, a in zip(s.groups, allocs)]
    # virtual-block-uses-kernel-block: the kernel is handed b where it needs the physical B.
    sizes = [g.b if knobs.virtual_from_kernel_block else g.block_size for g in s.groups]
    padded = max(s.batch.num_tokens_padded, s.batch.num_tokens)
    common = (("mrv2", T, knobs), lambda: [  # the same on every rank
        _i32(s.batch.rows_v2()), _i32(sizes), _i32(g.b for g in s.groups), _i32(g.world(s.cp) for g in s.groups),
        _i32(int(g.circular) for g in s.groups), padding_array(s, padded)])
    widths = [t.shape[1] for t in tables]

    def own(a: list[Allocation], peer=lambda t: t) -> list[np.ndarray]:  # a rank's tables and live blocks
        return [*_ptrs([peer(t) for t in tables]), num_blocks_array(s, a, widths)]
    bt, (rows, block_sizes, kernel_sizes, cp_sizes, circ, flags, ptrs, strides, nb) = prep.batch(
        clamp=T, shared=common, own=(("mrv2", T, knobs), own(allocs), own))
    prep.launch(",".join(g.name for g in s.groups))
    _compute_slot_mappings_kernel[(len(s.groups), s.batch.num_reqs + 1)](
        T, rows, bt.query_start_loc, bt.positions, ptrs, strides,
        nb, nb.stride(0), block_sizes, kernel_sizes, cp_sizes,
        out, out.stride(0), rank,
        CP_SIZE=s.cp.world, CP_INTERLEAVE=s.cp.interleave, PAD_ID=PAD_SLOT_ID, TRITON_BLOCK_SIZE=TILE,
        is_padding=flags if s.batch.has_padding else None,
        is_circular=circ if any(g.circular for g in s.groups) else None, num_tokens_padded=min(bt.num_tokens, T),
        FAULT=knobs.kernel_fault,
    )
    return RankOutput(out, [True] * len(s.groups), widths, [g.b for g in s.groups])


def run(s: Scenario, allocs: list[Allocation], rank: int, prep: PerRank, knobs: Knobs) -> RankOutput:
    """One fused launch over every group (the MRV2 kernel where only it can express the scenario)."""
    prepare_triton(prep.device)
    if needs_mrv2(s, knobs):
        return run_mrv2(s, allocs, rank, prep, knobs)
    from cpsim.kernels.triton_v2 import _compute_slot_mappings_kernel

    T = knobs.buffer_entries(s, "v2")
    out = prep.buffer(range(len(s.groups)), T, torch.int64)
    shapes = [table_shape(s, g, knobs) for g in s.groups]
    tables = [prep.table(a, shape) for a, shape in zip(allocs, shapes)]
    entry = [shape.entry_size for shape in shapes]
    common = (("v2", T, knobs), lambda: [  # the same on every rank
        _i32(s.batch.rows_v2()), _i32(entry), _i32(int(g.slot_mapped) for g in s.groups),
        _i32(g.world(s.cp) for g in s.groups), _i32(int(g.circular) for g in s.groups)])

    def own(a: list[Allocation], peer=lambda t: t) -> tuple[np.ndarray, np.ndarray]:  # a rank's table pointers
        return _ptrs([peer(t) for t in tables])
    bt, (rows, entry_t, enabled, cp_sizes, circular, ptrs, strides) = prep.batch(
        clamp=T, shared=common, own=(("v2", T, knobs), own(allocs), own))
    args = (min(bt.num_tokens, T), T, rows, bt.query_start_loc, bt.positions, ptrs, strides, entry_t,
            out, out.stride(0), rank)
    if knobs.kernel_design == "tile":
        tile_launch.launch_v2(s, args, enabled, cp_sizes, circular, out, knobs.kernel_fault)
    else:
        _compute_slot_mappings_kernel[(len(s.groups), s.batch.num_reqs + 1)](
            *args,
            CP_SIZE=s.cp.world, CP_INTERLEAVE=s.cp.interleave, PAD_ID=PAD_SLOT_ID, TRITON_BLOCK_SIZE=TILE,
            BLOCK_TABLE_WINDOW_SIZE=kernels.window_size(TILE, min(entry)),
            slot_mapping_enabled=enabled, group_cp_sizes=cp_sizes, is_circular=circular,
            FAULT=knobs.kernel_fault, POS_INT32=v1.pos_int32(s),
        )
    return RankOutput(out, [True] * len(s.groups), [t.shape[1] for t in tables], list(entry))

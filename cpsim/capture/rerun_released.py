"""Rerun an explicit step through a released ABI (vLLM v1 and MRV2, vllm-ascend 0.18-0.23 v2, cpsim-mrv2).

The step's tables, positions, ``query_start_loc`` and ``idx_mapping`` are handed over as they were
captured; what changes per ABI is what its release's host adds around them (as the launch adapters of
``cpsim.paths.adapters`` do for a scenario):

* vLLM shards KV over DCP only: ``CP_SIZE`` / ``TOTAL_CP_WORLD_SIZE`` is the DCP size and the rank the
  DCP rank (v1 0.19-0.25: PCP x DCP and the total rank), every MRV2 group in one launch with
  ``slot_mapping_enabled`` (false for a ring: the release's ``CircularBufferSpec``) and, from 0.31,
  ``dcp_sharded``;
* a physical-table ABI (``vllm-v1-0.32``, ``vllm-mrv2-0.18``, ``vllm-mrv2-0.32``, ``ascend-v2-0.18``)
  needs tables of physical ids: a step whose tables hold kernel blocks is exit 2 naming the group;
  a kernel-block ABI gets ``kernel_block_sizes`` = the step's entry sizes and ``block_sizes`` = B;
* ``cpsim-mrv2`` gets each table row's live count (``num_blocks``) and each group's own CP size.

Runs in a kernel worker (``cpsim.capture.rerun.run``), never in the judging process.
"""

from __future__ import annotations

import numpy as np
import torch

from cpsim.capture.batch import ExplicitStep, RankBatch
from cpsim.errors import ConfigError
from cpsim.kernels.under_test import ABIS
from cpsim.layout import PAD_SLOT_ID, POISON, table_guard_id
from cpsim.paths import _intact
from cpsim.paths._guard import WIDTH

TILE = 1024
ASCEND_TOTAL_BLOCK_SIZE = 4096  # vllm-ascend 0.18-0.23 AscendBlockTables passes this fixed table window
PHYSICAL = ("vllm-v1-0.32", "vllm-mrv2-0.18", "vllm-mrv2-0.32", "ascend-v2-0.18")
V1 = ("vllm-v1-0.19", "vllm-v1-0.26", "vllm-v1-0.32")
V2 = ("vllm-mrv2-0.18", "vllm-mrv2-0.29", "vllm-mrv2-0.31", "vllm-mrv2-0.32", "ascend-v2-0.18", "cpsim-mrv2")
RELEASED = V1 + V2


def _t(a, dtype, device) -> torch.Tensor:
    return torch.as_tensor(np.ascontiguousarray(a)).to(device=device, dtype=dtype)


def _slot_dtype(k, step: ExplicitStep) -> torch.dtype:
    """The slot buffer the step's host handed the kernel: its ``limits.slot_buffer_dtype``, else the ABI's
    (the kernel's stores are cast to it, as on the host)."""
    return torch.int32 if ABIS[k.abi].buffer_dtype(step.limits.slot_buffer_dtype) == "int32" else torch.int64


def _framed(step: ExplicitStep, gi: int, table: np.ndarray, device) -> torch.Tensor:
    """The captured table inside ``WIDTH`` guard rows above and below (guard ids past the cache), as the
    paths frame theirs: a kernel that reads row -1 (a dummy request's) reads guard ids, which ``row-bounds``
    names, not memory outside the tensor."""
    g, e = step.groups[gi], step.entry_sizes[gi]
    rows, width = table.shape
    full = torch.full((rows + 2 * WIDTH, max(width, 1)), table_guard_id(g.num_blocks, g.block_size, e),
                      dtype=torch.int32, device=device)
    inner = full[WIDTH:WIDTH + rows, :width]
    inner.copy_(_t(table, torch.int32, device))
    return inner


def check_tables(k, step: ExplicitStep) -> None:
    """Exit 2 (ConfigError naming the group) where a physical-table ABI is handed kernel-block tables;
    checked in the judging process, before any worker runs the kernel."""
    if k.abi not in PHYSICAL:
        return
    for g, e in zip(step.groups, step.entry_sizes):
        if e != g.block_size:
            raise ConfigError(f"--kernel-{step.path}", f"{k.spec}: the {k.abi} ABI reads physical tables (one id per "
                                                       f"block of {g.block_size}), but group {g.name}'s captured "
                                                       f"table holds kernel blocks of {e}")


def _world(k, step: ExplicitStep) -> int:
    """The CP size the release's host hands every group: PCP x DCP (vLLM v1 0.19-0.25, vllm-ascend, cpsim),
    else DCP (vLLM v1 from 0.26, every MRV2 release)."""
    return step.cp.world if k.abi in ("vllm-v1-0.19", "ascend-v2-0.18", "cpsim-mrv2") else step.cp.dcp


def rank(k, step: ExplicitStep, r: int, rb: RankBatch, T: int, device, written=None) -> np.ndarray:
    """Rank ``r``'s ``[groups, entries]`` int64 slots of released-ABI kernel ``k`` on the step's inputs;
    ``written`` (``cpsim.paths._intact.counts``) counts the input entries each launch wrote."""
    gis = [gi for gi, t in enumerate(rb.tables) if t is not None]
    out = np.full((len(step.groups), T), PAD_SLOT_ID, dtype=np.int64)
    if gis:
        fn = _v1 if k.abi in V1 else _v2
        fn(k, step, r, rb, T, device, gis, out, written)
    return out


def _v1(k, step: ExplicitStep, r: int, rb: RankBatch, T: int, device, gis: list[int], out: np.ndarray,
        written) -> None:
    """One launch per slot-mapped group, grid (num_reqs + 1,), ``num_tokens`` = the scheduled count."""
    qsl = _t(np.minimum(rb.query_start_loc, T), torch.int32, device)
    pos = _t(rb.positions, torch.int64, device)
    for gi in gis:
        g, e = step.groups[gi], step.entry_sizes[gi]
        if not g.slot_mapped or g.circular:  # vLLM's v1 skips state groups and has no ring rule: left PAD
            continue
        n = g.world(step.cp)
        if n == step.cp.world:
            n = _world(k, step)
        tab = _framed(step, gi, rb.tables[gi], device)
        buf = torch.full((T,), POISON, dtype=_slot_dtype(k, step), device=device)
        args = dict(num_tokens=min(rb.num_scheduled, T), max_num_tokens=T, query_start_loc_ptr=qsl, positions_ptr=pos,
                    block_table_ptr=tab, block_table_stride=tab.stride(0), block_size=e, slot_mapping_ptr=buf,
                    KV_CACHE_BLOCK_SIZE=g.block_size, BLOCKS_PER_KV_BLOCK=g.block_size // e, TOTAL_CP_WORLD_SIZE=n,
                    TOTAL_CP_RANK=r % n, CP_KV_CACHE_INTERLEAVE_SIZE=step.cp.interleave, PAD_ID=PAD_SLOT_ID,
                    BLOCK_SIZE=TILE)
        with _intact.bracket(written, [(gi, "positions", pos), (gi, "query_start_loc", qsl), (gi, "block table", tab)]):
            k.obj[(rb.num_reqs + 1,)](**{n_: v for n_, v in args.items() if n_ in k.params})
        out[gi] = buf.cpu().numpy()


def _v2(k, step: ExplicitStep, r: int, rb: RankBatch, T: int, device, gis: list[int], out: np.ndarray,
        written) -> None:
    """One launch over every group with a table, grid (groups, num_reqs + 1)."""
    n = _world(k, step)
    buf = torch.full((len(gis), T), POISON, dtype=_slot_dtype(k, step), device=device)
    tabs = [_framed(step, gi, rb.tables[gi], device) for gi in gis]
    groups = [step.groups[gi] for gi in gis]
    live = [rb.live(gi) if rb.live(gi) is not None else _live_off_row(rb.tables[gi]) for gi in gis]
    width = max(len(x) for x in live)
    nb = _t(np.stack([np.pad(x, (0, width - len(x))) for x in live]), torch.int32, device)
    kernel_blocks = "kernel_block_sizes" in k.params

    def i32(values):
        return torch.tensor(list(values), dtype=torch.int32, device=device)

    def flags(values):
        return torch.tensor(list(values), dtype=torch.bool, device=device)
    args = dict(
        max_num_tokens=T, idx_mapping=_t(rb.idx_mapping, torch.int32, device),
        query_start_loc=_t(np.minimum(rb.query_start_loc, T), torch.int32, device),
        pos=_t(rb.positions, torch.int64, device),
        block_table_ptrs=torch.tensor([t.data_ptr() for t in tabs], dtype=torch.int64, device=device),
        block_table_strides=torch.tensor([t.stride(0) for t in tabs], dtype=torch.int64, device=device),
        block_sizes=i32(g.block_size if kernel_blocks else step.entry_sizes[gi] for gi, g in zip(gis, groups)),
        kernel_block_sizes=i32(step.entry_sizes[gi] for gi in gis),
        slot_mapping_enabled=flags(not g.circular for g in groups),
        dcp_sharded=flags(g.world(step.cp) > 1 for g in groups),
        group_cp_sizes=i32(g.world(step.cp) for g in groups), is_circular=i32(int(g.circular) for g in groups),
        num_blocks_ptr=nb, num_blocks_stride=nb.stride(0), TOTAL_BLOCK_SIZE=ASCEND_TOTAL_BLOCK_SIZE,
        is_padding=_t(rb.is_padding if rb.is_padding is not None else np.zeros(rb.num_scheduled, bool),
                      torch.bool, device),
        slot_mappings_ptr=buf, slot_mappings_stride=buf.stride(0), cp_rank=r % n, CP_SIZE=n,
        CP_INTERLEAVE=step.cp.interleave, PAD_ID=PAD_SLOT_ID, TRITON_BLOCK_SIZE=TILE,
    )
    watched = [(gis[0], "positions", args["pos"]), (gis[0], "query_start_loc", args["query_start_loc"]),
               (gis[0], "idx_mapping", args["idx_mapping"])]
    with _intact.bracket(written, watched + [(gi, "block table", t) for gi, t in zip(gis, tabs)]):
        k.obj[(len(gis), rb.num_reqs + 1)](**{n_: v for n_, v in args.items() if n_ in k.params})
    out[gis] = buf.cpu().to(torch.int64).numpy()


def _live_off_row(table: np.ndarray) -> np.ndarray:
    """Entries up to each row's last non-zero id: a table row's live count when the step gives none."""
    nz = table != 0
    return np.where(nz.any(1), table.shape[1] - np.argmax(nz[:, ::-1], 1), 0).astype(np.int64)

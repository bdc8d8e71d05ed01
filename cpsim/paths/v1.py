"""The v1 path: vllm-ascend ``BlockTable`` / ``MultiGroupBlockTable`` for one rank.

One table per group, rows indexed by request, logical (kernel-block) entries.
Mamba groups have no slot mapping in v1 and are skipped.
"""

from __future__ import annotations

import numpy as np
import torch

from cpsim import kernels, layout, sizing
from cpsim.allocator import Allocation
from cpsim.layout import PAD_SLOT_ID
from cpsim.paths import tile_launch
from cpsim.paths._inputs import prepare_triton
from cpsim.paths.prep import PerRank, TableShape
from cpsim.paths.types import Knobs, RankOutput
from cpsim.scenario import INT32_MAX, KVGroup, Scenario

TILE = 1024


def physical_width(s: Scenario, g: KVGroup, knobs: Knobs) -> int:
    """``max_num_blocks_per_req``: the plugged-in sizing's (``--sizing``), else cpsim's
    (:func:`cpsim.sizing.cpsim_width`: divided by the group's CP size for sharded attention only)."""
    given = sizing.sized_width(knobs.host_sizing, "v1", s, g)
    if given is not None:
        return given
    n = s.cp.world
    mml = s.limits.max_model_len
    if g.world(s.cp) > 1 and knobs.sharded_width_undivided:
        return layout.cdiv(mml, g.block_size)
    if g.world(s.cp) == 1 and knobs.unsharded_width_per_cp:
        return layout.table_width(mml, g.block_size, n)
    return g.row_blocks or sizing.cpsim_width("v1", mml, g.block_size, g.world(s.cp), n)


def pos_int32(s: Scenario) -> bool:
    """Whether the per-request kernels may do position math in int32 (every intermediate <= the position)."""
    return s.limits.max_model_len <= INT32_MAX


def buffer_size(s: Scenario, knobs: Knobs) -> int:
    return knobs.buffer_entries(s, "v1")


def table_shape(s: Scenario, g: KVGroup, knobs: Knobs) -> TableShape:
    """v1's table of group ``g``: a row per request, logical (kernel-block) entries."""
    return TableShape(group_number(s, g), tuple(range(s.batch.num_reqs)), s.limits.max_num_reqs,
                      physical_width(s, g, knobs), g.bpk, g.num_blocks, g.block_size, g.b)


def group_number(s: Scenario, g: KVGroup) -> int:
    """Which of the scenario's groups ``g`` is (by identity: two groups may be equal)."""
    return next(i for i, x in enumerate(s.groups) if x is g)


def _sizes(s: Scenario, g: KVGroup, knobs: Knobs) -> tuple[int, int]:
    """(KV_CACHE_BLOCK_SIZE, BLOCKS_PER_KV_BLOCK) handed to the kernel."""
    if knobs.virtual_from_kernel_block and g.bpk > 1:
        return g.b, 1
    return g.block_size, g.bpk


def _poisoned(s: Scenario, knobs: Knobs, prep: PerRank) -> torch.Tensor:
    """[groups, slot buffer entries] of POISON: a row per group."""
    return prep.buffer(range(len(s.groups)), buffer_size(s, knobs), torch.int64)


def _result(out: torch.Tensor, s: Scenario, knobs: Knobs, enabled: list[bool]) -> RankOutput:
    widths = [physical_width(s, g, knobs) * g.bpk for g in s.groups]
    return RankOutput(out, enabled, widths, [g.b for g in s.groups])


def run(s: Scenario, allocs: list[Allocation], rank: int, prep: PerRank, knobs: Knobs) -> RankOutput:
    """One launch per group with slots, then the runner's padding mask."""
    prepare_triton(prep.device)
    from cpsim.kernels.triton_v1 import _compute_slot_mapping_kernel

    T = buffer_size(s, knobs)
    bt, _ = prep.batch(clamp=T)  # a short buffer drops tokens; capacity reports it
    out = prep.buffer(range(len(s.groups)), T, torch.int64)
    for gi, g in enumerate(s.groups):
        if not g.slot_mapped:
            continue
        n = g.world(s.cp)
        table = prep.table(allocs[gi], table_shape(s, g, knobs))
        kv_bs, bpk = _sizes(s, g, knobs)
        prep.launch(g.name)
        if knobs.kernel_design == "tile":
            tile_launch.launch_v1(s, g, min(bt.num_tokens, T), bt.query_start_loc, bt.positions, table, out[gi], kv_bs,
                            bpk, rank, knobs.kernel_fault)
            continue
        _compute_slot_mapping_kernel[(s.batch.num_reqs + 1,)](
            min(bt.num_tokens, T), T, bt.query_start_loc, bt.positions, table, table.stride(0), g.b, out[gi],
            KV_CACHE_BLOCK_SIZE=kv_bs, BLOCKS_PER_KV_BLOCK=bpk,
            TOTAL_CP_WORLD_SIZE=n, TOTAL_CP_RANK=layout.shard_rank(rank, n),
            CP_KV_CACHE_INTERLEAVE_SIZE=s.cp.interleave, PAD_ID=PAD_SLOT_ID,
            TILE_BLOCK_SIZE=TILE, BLOCK_TABLE_WINDOW_SIZE=kernels.window_size(TILE, g.b),
            IS_CIRCULAR=g.circular, FAULT=knobs.kernel_fault, POS_INT32=pos_int32(s),
        )
        if knobs.draft_overwrite and not g.circular:
            _write_draft(s, g, table, kv_bs, n, layout.shard_rank(rank, n), out[gi])
    mask_padding(s, out, prep)
    return _result(out, s, knobs, [g.slot_mapped for g in s.groups])


def mask_padding(s: Scenario, out: torch.Tensor, prep: PerRank) -> None:
    """is_padding tokens get PAD after the launch: the v1 kernels (vllm-ascend ``BlockTable``)
    have no is_padding input, so the runner's mask is applied on the host, in every group."""
    if s.batch.has_padding:
        def index() -> list[np.ndarray]:
            idx = np.flatnonzero(s.batch.padding_mask())
            return [idx[idx < out.shape[1]]]
        # index_fill_: one operation, where ``out[:, idx] = PAD`` goes through advanced indexing
        out.index_fill_(1, prep.shared(("padding", out.shape[1]), index)[0], PAD_SLOT_ID)


def draft_positions(s: Scenario) -> tuple[torch.Tensor, torch.Tensor]:
    """(request index, position) of the MTP draft input, request-major.

    Each request's scheduled positions followed by ``num_speculative_tokens - 1``
    look-ahead positions (vllm-ascend ``generate_pcp_mtp_input``).
    """
    extra = max(s.limits.num_speculative_tokens - 1, 0)
    req, pos = [], []
    for i, r in enumerate(s.batch.requests):
        if r.num_tokens == 0:
            continue
        p = torch.arange(r.context_len, r.seq_len + extra, dtype=torch.int64)
        req.append(torch.full_like(p, i))
        pos.append(p)
    if not pos:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    return torch.cat(req), torch.cat(pos)


def _write_draft(s: Scenario, g: KVGroup, table: torch.Tensor, kv_bs: int, n: int, rank: int,
                 out: torch.Tensor) -> None:
    """draft-overwrite: the CPU draft mapping lands in the buffer the kernel just wrote.

    Upstream the two writers share ``BlockTable.slot_mapping``; whichever lands
    last wins. Here the draft copy lands last, so the main model's consumer (the
    only one the oracle sees) reads draft slots.
    """
    from cpsim.kernels.torch_dcp import compute_dcp_slot_mapping

    if s.limits.num_speculative_tokens < 2:
        return
    req, pos = draft_positions(s)
    req, pos = req.to(out.device), pos.to(out.device)
    slots = compute_dcp_slot_mapping(req, pos, table, g.b, kv_bs, n, rank, s.cp.interleave, PAD_SLOT_ID)
    m = min(len(slots), out.shape[0])
    out[:m] = slots[:m]


def run_fused(s: Scenario, allocs: list[Allocation], rank: int, prep: PerRank,
              knobs: Knobs) -> RankOutput | None:
    """All groups in one launch; exists for CP world size 1 only."""
    if s.cp.world > 1:
        return None
    device = prep.device
    prepare_triton(device)
    from cpsim.kernels.triton_v1 import _compute_slot_mapping_fused_kernel

    T = buffer_size(s, knobs)
    bt, _ = prep.batch(clamp=T)
    out = prep.buffer(range(len(s.groups)), T, torch.int64)
    groups = [(gi, g) for gi, g in enumerate(s.groups) if g.slot_mapped]
    if groups:
        tables = [prep.table(allocs[gi], table_shape(s, g, knobs)) for gi, g in groups]
        view = prep.buffer([gi for gi, _ in groups], T, torch.int64)
        ptrs = torch.tensor([t.data_ptr() for t in tables], dtype=torch.int64, device=device)
        strides = torch.tensor([t.stride(0) for t in tables], dtype=torch.int64, device=device)
        sizes = torch.tensor([g.b for _, g in groups], dtype=torch.int32, device=device)
        circ = torch.tensor([int(g.circular) for _, g in groups], dtype=torch.int32, device=device)
        qsl = bt.query_start_loc
        if knobs.kernel_design == "tile":
            tile_launch.launch_v1_fused(s, min(bt.num_tokens, T), qsl, bt.positions, ptrs, strides, sizes, circ, view,
                                  knobs.kernel_fault)
        else:
            _compute_slot_mapping_fused_kernel[(len(groups), s.batch.num_reqs + 1)](
                min(bt.num_tokens, T), T, qsl, bt.positions, ptrs, strides, sizes, circ,
                view, view.stride(0), PAD_ID=PAD_SLOT_ID, TILE_BLOCK_SIZE=TILE,
                BLOCK_TABLE_WINDOW_SIZE=kernels.window_size(TILE, min(g.b for _, g in groups)),
                FAULT=knobs.kernel_fault, POS_INT32=pos_int32(s),
            )
        out[[gi for gi, _ in groups]] = view
    mask_padding(s, out, prep)
    return _result(out, s, knobs, [g.slot_mapped for g in s.groups])


def run_torch(s: Scenario, allocs: list[Allocation], rank: int, prep: PerRank,
              knobs: Knobs) -> RankOutput:
    """The DCP torch path production uses when DCP > 1 (run here at every CP size)."""
    from cpsim.kernels.torch_dcp import compute_dcp_slot_mapping

    device = prep.device
    bt, _ = prep.batch()
    out = prep.buffer(range(len(s.groups)), buffer_size(s, knobs), torch.int64)
    T = out.shape[1]
    n_tok = min(bt.num_scheduled, T)
    # numpy, not torch.repeat_interleave: with intra-op threads on a busy CPU the latter took ~20 ms.
    req = torch.from_numpy(s.batch.token_request()).to(device)[:n_tok]
    pos = bt.positions[:n_tok]
    enabled = []
    for gi, g in enumerate(s.groups):
        enabled.append(g.slot_mapped)
        if not g.slot_mapped:
            continue
        table = prep.table(allocs[gi], table_shape(s, g, knobs))
        if g.circular:
            first = table[:, 0].to(torch.int64)[req]
            slots = torch.where(pos >= 0, first * g.b + pos % g.b, torch.full_like(pos, PAD_SLOT_ID))
        else:
            n = g.world(s.cp)
            kv_bs, _ = _sizes(s, g, knobs)
            slots = compute_dcp_slot_mapping(req, pos, table, g.b, kv_bs, n, layout.shard_rank(rank, n),
                                             s.cp.interleave, PAD_SLOT_ID)
        out[gi, :n_tok] = slots
        start = bt.num_tokens if knobs.kernel_fault & kernels.FAULT_STALE_TAIL else n_tok
        out[gi, start:] = PAD_SLOT_ID
    mask_padding(s, out, prep)
    return _result(out, s, knobs, enabled)

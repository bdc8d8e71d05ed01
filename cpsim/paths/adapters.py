"""Adapters: drive a user's kernel for one rank through its own ABI.

Tables, batch tensors and buffer sizes come from the path modules, so a user's
kernel sees exactly what cpsim's built-in kernel would see on that path; only
the argument list, the grid and the output dtype change. Outputs are poisoned
before every launch and handed on as int64 (int32 results are sign-extended,
so a wrapped slot shows up as a violation instead of being hidden).

What an ABI cannot express is not faked: the group is left out of the check
(``enabled`` False) and the kernel records a note saying why.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from cpsim import kernels
from cpsim.layout import PAD_SLOT_ID
from cpsim.paths import v1
from cpsim.paths._inputs import prepare_triton
from cpsim.paths.launch_args import (TILE, _check_int32, _i32, _i64, _note_dcp_only, _out_dtype, _physical,
                                     _skip_circular, slot_entries, v1_state_launch, v1_state_width)
from cpsim.paths.mrv2_adapters import _mrv2, _mrv2_flags, _v2
from cpsim.paths.prep import PerRank, TableShape
from cpsim.paths.types import Knobs, RankOutput
from cpsim.scenario import KVGroup, Scenario

FUSED_PARALLEL_TILES = 2  # cpsim's choice: >1 so the tile-striding loop is exercised


def run(k, path: str, s: Scenario, allocs, rank: int, prep: PerRank, knobs: Knobs) -> RankOutput | None:
    """One rank run of ``k`` on ``path``: its tables, batch tensors and buffers from ``prep``."""
    if knobs.kernel_fault:
        k.note("fault switches compile into cpsim's built-in kernels only; ignored for the kernel under test")
    if path == "v1-fused" and s.cp.world > 1:
        return None
    if k.abi == "callable":
        out = _callable(k, path, s, allocs, rank, prep, knobs)
        _mask_padding(k, s, out, prep)
        return out
    runner = {"ascend-v1": _ascend_v1, "ascend-v1-fused": _ascend_v1_fused,
              "ascend-v1-fused-adaptive": _ascend_v1_fused,
              "vllm-v1-0.19": _vllm_v1, "vllm-v1-0.26": _vllm_v1, "vllm-v1-0.32": _vllm_v1,
              "ascend-v2": _v2, "ascend-v2-0.18": _v2, "ascend-v2-0.23": _v2, "vllm-v2": _v2, "vllm-mrv2-0.18": _v2, "vllm-mrv2-0.22": _v2,
              "vllm-mrv2-0.29": _mrv2_flags, "vllm-mrv2-0.31": _mrv2_flags, "vllm-mrv2-0.32": _mrv2_flags,
              "cpsim-mrv2": _mrv2}[k.abi]
    prepare_triton(prep.device)
    out = runner(k, s, allocs, rank, prep, knobs)
    if k.abi != "cpsim-mrv2" or "is_padding" not in k.params:
        _mask_padding(k, s, out, prep)
    return out


# Released MRV2 kernels that emit PAD themselves for a dummy request (idx_mapping == -1): vLLM 0.31+.
DUMMY_AWARE = ("vllm-mrv2-0.31", "vllm-mrv2-0.32")


def _mask_padding(k, s: Scenario, out: RankOutput | None, prep: PerRank) -> None:
    """An ABI without an is_padding input cannot see padding tokens: the mask is applied on
    the host (as cpsim's v1 paths do) and the kernel is not judged on it. A kernel whose release
    pads a dummy request's tokens itself (``DUMMY_AWARE``) is judged on those: they stay out of the mask."""
    if out is None or not s.batch.has_padding:
        return
    if k.abi in DUMMY_AWARE:
        rows = np.asarray(s.batch.rows_v2()[:s.batch.num_reqs], dtype=np.int64)
        dummy = rows[s.batch.token_request()] < 0
        mask = s.batch.padding_mask() & ~dummy
        k.note(f"the {k.abi} kernel takes no is_padding input: is_padding tokens of real requests were set to "
               f"PAD on the host after the launch (not checked); a dummy request's tokens (idx_mapping -1) "
               f"are the kernel's to pad, as in its release")
        idx = np.flatnonzero(mask)
        idx = torch.from_numpy(idx[idx < out.slots.shape[1]]).to(out.slots.device)
        out.slots.index_fill_(1, idx, PAD_SLOT_ID)
        return
    k.note(f"the {k.abi} kernel takes no is_padding input: is_padding tokens were set to PAD on the host "
           f"after the launch, so the kernel is not checked on them")
    v1.mask_padding(s, out.slots, prep)



def _release_cp(k, s: Scenario, g: KVGroup, rank: int) -> tuple[int, int]:
    """(CP size, CP rank) the release's v1 host hands group ``g``: vLLM 0.19-0.25 pass PCP x DCP and the
    total rank; from 0.26 a group sharded over cpsim's whole N is sharded over DCP (``dcp_world_size``,
    ``dcp_rank``, the total rank mod DCP). Replicated and partial groups keep cpsim's per-group size."""
    n = g.world(s.cp)
    if k.abi != "vllm-v1-0.19" and n == s.cp.world and s.cp.pcp > 1:
        n = s.cp.dcp
    return n, rank % n


# ---- vLLM v1 (0.19-0.33): one launch per slot-mapped group -------------------

def _vllm_v1(k, s: Scenario, allocs, rank: int, prep: PerRank, knobs: Knobs) -> RankOutput:
    """As vLLM's ``BlockTable.compute_slot_mapping``: grid (num_reqs + 1,), ``num_tokens`` =
    ``positions.shape[0]`` (the runner slices positions to the scheduled count), int64 buffer.
    0.19-0.25 pass the kernel block as ``block_size`` over a kernel-block table and CP = PCP x DCP;
    0.26-0.31 add KV_CACHE_BLOCK_SIZE / BLOCKS_PER_KV_BLOCK; 0.32+ take a physical table."""
    device = prep.device
    bt, _ = prep.batch()
    out = prep.buffer(range(len(s.groups)), slot_entries(k, s, knobs, "v1"), torch.int64)
    T = out.shape[1]
    n_tok = min(bt.num_scheduled, T)
    qsl = bt.query_start_loc.clamp(max=T)
    positions = bt.positions[:n_tok]  # the runner hands positions[:total_num_scheduled_tokens]
    if k.abi != "vllm-v1-0.19":
        _note_dcp_only(k, s)
    enabled = []
    for gi, g in enumerate(s.groups):
        state = v1_state_launch(k.abi, g)
        if (not g.slot_mapped and not state) or g.circular:
            if g.circular:
                k.note(f"group {g.name}: no vLLM release has a ring-buffer sliding-window slot rule (its "
                       f"sliding-window groups map every position as a plain table); group not checked")
            enabled.append(False)
            continue
        n, cp_rank = (s.cp.world, rank) if state else _release_cp(k, s, g, rank)
        if state:  # one CP size for every group, the runner's state width; its output is not judged
            k.note(f"group {g.name}: {g.kind} groups have no slot mapping, but the {k.abi} releases launch the "
                   f"kernel for every group: launched, its output not checked")
            table = prep.table(allocs[gi], dataclasses.replace(v1.table_shape(s, g, knobs),
                                                               width=v1_state_width(s, g)))
        elif k.abi == "vllm-v1-0.32":
            table = prep.table(allocs[gi], TableShape(gi, tuple(range(s.batch.num_reqs)), s.limits.max_num_reqs,
                                                      v1.physical_width(s, g, knobs), 1, g.num_blocks,
                                                      g.block_size, g.block_size))
        else:
            table = prep.table(allocs[gi], v1.table_shape(s, g, knobs))
        buf = prep.buffer([gi], T, _out_dtype(k, s))[0]
        args = dict(num_tokens=n_tok, max_num_tokens=T, query_start_loc_ptr=qsl, positions_ptr=positions,
                    block_table_ptr=table, block_table_stride=table.stride(0), slot_mapping_ptr=buf,
                    TOTAL_CP_WORLD_SIZE=n, TOTAL_CP_RANK=cp_rank, CP_KV_CACHE_INTERLEAVE_SIZE=s.cp.interleave,
                    PAD_ID=PAD_SLOT_ID, BLOCK_SIZE=TILE)
        kv_bs, bpk = v1._sizes(s, g, knobs)
        if k.abi == "vllm-v1-0.19":
            args["block_size"] = g.b
        elif k.abi == "vllm-v1-0.26":
            args.update(block_size=g.b, KV_CACHE_BLOCK_SIZE=kv_bs, BLOCKS_PER_KV_BLOCK=bpk)
        else:
            args["KV_CACHE_BLOCK_SIZE"] = g.b if knobs.virtual_from_kernel_block else g.block_size
        prep.launch(g.name)
        with prep.bracket([(gi, "positions", bt.positions), (gi, "query_start_loc", qsl),
                           (gi, "block table", table)]):
            k.obj[(s.batch.num_reqs + 1,)](**args)
        out[gi] = buf
        enabled.append(not state)
    res = v1._result(out, s, knobs, enabled)
    if k.abi == "vllm-v1-0.32":  # physical entries: one per block of B slots
        res = RankOutput(res.slots, res.enabled, [v1.physical_width(s, g, knobs) for g in s.groups],
                         [g.block_size for g in s.groups])
    return res


# ---- v1: one launch per group, logical (kernel-block) table -----------------

def _ascend_v1(k, s: Scenario, allocs, rank: int, prep: PerRank, knobs: Knobs) -> RankOutput:
    device = prep.device
    bt, _ = prep.batch()
    out = v1._poisoned(s, knobs, prep)
    T = out.shape[1]
    qsl = bt.query_start_loc.clamp(max=T)
    has_circular = "IS_CIRCULAR" in k.params
    enabled = []
    for gi, g in enumerate(s.groups):
        if not g.slot_mapped or (g.circular and not has_circular):
            if g.slot_mapped:
                _skip_circular(k, g)
            enabled.append(False)
            continue
        _check_int32(k, s, g)
        n = g.world(s.cp)
        table = prep.table(allocs[gi], v1.table_shape(s, g, knobs))
        kv_bs, bpk = v1._sizes(s, g, knobs)
        buf = prep.buffer([gi], T, _out_dtype(k, s))[0]
        args = dict(
            num_tokens=min(bt.num_tokens, T), max_num_tokens=T, query_start_loc_ptr=qsl,
            positions_ptr=bt.positions, block_table_ptr=table, block_table_stride=table.stride(0),
            block_size=g.b, slot_mapping_ptr=buf, KV_CACHE_BLOCK_SIZE=kv_bs, BLOCKS_PER_KV_BLOCK=bpk,
            TOTAL_CP_WORLD_SIZE=n, TOTAL_CP_RANK=rank % n,
            CP_KV_CACHE_INTERLEAVE_SIZE=s.cp.interleave, PAD_ID=PAD_SLOT_ID, TILE_BLOCK_SIZE=TILE,
            BLOCK_TABLE_WINDOW_SIZE=kernels.window_size(TILE, g.b),
        )
        if has_circular:
            args["IS_CIRCULAR"] = g.circular
        prep.launch(g.name)
        with prep.bracket([(gi, "positions", bt.positions), (gi, "query_start_loc", qsl),
                           (gi, "block table", table)]):
            k.obj[(s.batch.num_reqs + 1,)](**args)
        out[gi] = buf.to(torch.int64)
        enabled.append(True)
    return v1._result(out, s, knobs, enabled)


def adaptive_tile(num_tokens: int, num_reqs: int, lo: int = 16) -> int:
    """SMALL_TILE_BLOCK_SIZE for the adaptive fused kernel: tokens per request rounded up to a
    power of two, between ``lo`` and 1024 (cpsim's choice; upstream picks from its own ladder)."""
    per_req = -(-max(num_tokens, 1) // max(num_reqs, 1))
    return min(max(kernels.next_pow2(per_req), lo), TILE)


def _ascend_v1_fused(k, s: Scenario, allocs, rank: int, prep: PerRank, knobs: Knobs) -> RankOutput:
    device = prep.device
    bt, _ = prep.batch()
    out = v1._poisoned(s, knobs, prep)
    T = out.shape[1]
    has_circular = "is_circular_ptr" in k.params
    groups = []
    for gi, g in enumerate(s.groups):
        if g.slot_mapped and g.circular and not has_circular:
            _skip_circular(k, g)
        elif g.slot_mapped:
            _check_int32(k, s, g)
            groups.append((gi, g))
    if groups:
        tables = [prep.table(allocs[gi], v1.table_shape(s, g, knobs)) for gi, g in groups]
        bufs = [prep.buffer([gi], T, _out_dtype(k, s))[0] for gi, _ in groups]
        smallest = min(g.b for _, g in groups)
        args = dict(
            num_tokens=min(bt.num_tokens, T), max_num_tokens=T,
            query_start_loc_ptr=bt.query_start_loc.clamp(max=T), positions_ptr=bt.positions,
            block_table_addrs_ptr=_i64((t.data_ptr() for t in tables), device),
            slot_mapping_addrs_ptr=_i64((b.data_ptr() for b in bufs), device),
            block_table_strides_ptr=_i64((t.stride(0) for t in tables), device),
            block_sizes_ptr=_i32((g.b for _, g in groups), device),
            PAD_ID=PAD_SLOT_ID, NUM_REQS=s.batch.num_reqs,
        )
        adaptive = k.abi == "ascend-v1-fused-adaptive"
        if adaptive:
            small = adaptive_tile(bt.num_scheduled, s.batch.num_reqs)
            args.update(SMALL_TILE_BLOCK_SIZE=small,
                        SMALL_BLOCK_TABLE_WINDOW_SIZE=kernels.window_size(small, smallest),
                        LARGE_BLOCK_TABLE_WINDOW_SIZE=kernels.window_size(TILE, smallest))
        else:
            args.update(TILE_BLOCK_SIZE=TILE, PARALLEL_TILES=FUSED_PARALLEL_TILES,
                        BLOCK_TABLE_WINDOW_SIZE=kernels.window_size(TILE, smallest))
        if has_circular:
            args["is_circular_ptr"] = _i32((int(g.circular) for _, g in groups), device)
            if "HAS_CIRCULAR" in k.params:
                args["HAS_CIRCULAR"] = any(g.circular for _, g in groups)
        prep.launch(",".join(g.name for _, g in groups))
        per_group = s.batch.num_reqs + 1 if adaptive else s.batch.num_reqs * FUSED_PARALLEL_TILES + 1
        with prep.bracket([(groups[0][0], "positions", bt.positions),
                           (groups[0][0], "query_start_loc", args["query_start_loc_ptr"])]
                          + [(gi, "block table", t) for (gi, _), t in zip(groups, tables)]):
            k.obj[(len(groups) * per_group,)](**args)
        for (gi, _), buf in zip(groups, bufs):
            out[gi] = buf.to(torch.int64)
    done = {gi for gi, _ in groups}
    return v1._result(out, s, knobs, [gi in done for gi in range(len(s.groups))])


# ---- callable: a Python function per group ----------------------------------

def callable_needs(params, g: KVGroup, n: int, world: int) -> str:
    """The input a callable must declare before group ``g`` (CP size ``n`` of the world's ``world``) can be
    judged fairly, or "": a ring table needs ``is_circular`` (no released runtime has the ring rule, so
    a kernel cannot be expected to know it unasked); a callable that reads the world CP size (as
    upstream's kernels read ``CP_SIZE``) needs ``cp_sharded`` or ``cp_world_size`` for a group that does
    not span the world (vLLM #57260 is the bug of not telling). A callable that asks for no CP input
    at all is judged as it is: a kernel blind to CP is exactly what the checks are for."""
    if g.circular and "is_circular" not in params:
        return "is_circular"
    reads_world = "world_cp_size" in params or "world_cp_rank" in params
    if reads_world and n != world and not {"cp_sharded", "cp_world_size"} & set(params):
        return "cp_sharded" if n == 1 else "cp_world_size"
    return ""


def _callable(k, path: str, s: Scenario, allocs, rank: int, prep: PerRank, knobs: Knobs) -> RankOutput:
    device = prep.device
    bt, _ = prep.batch()
    out = v1._poisoned(s, knobs, prep) if path != "v2" else prep.buffer(
        range(len(s.groups)), knobs.buffer_entries(s, path), torch.int64)
    T = out.shape[1]
    n_tok = bt.num_scheduled
    counts = (bt.query_start_loc[1:] - bt.query_start_loc[:-1]).to(torch.int64)
    req = torch.repeat_interleave(torch.arange(s.batch.num_reqs, device=device), counts)
    widths, entries, enabled = [], [], []
    faults = [0] * len(s.groups)
    for gi, g in enumerate(s.groups):
        if path == "v2":
            table, entry = _physical(s, g, allocs[gi], knobs, prep)
            rows, kv_bs = s.batch.rows_v2(), entry
        else:
            table, entry = prep.table(allocs[gi], v1.table_shape(s, g, knobs)), g.b
            rows, kv_bs = range(s.batch.num_reqs), v1._sizes(s, g, knobs)[0]
        widths.append(table.shape[1])
        entries.append(entry)
        n = g.world(s.cp)
        missing = callable_needs(k.params, g, n, s.cp.world)
        if missing:
            k.note(f"group {g.name}: not checked: ask for {missing} (the callable cannot map this group "
                   f"correctly without it)")
        enabled.append(g.slot_mapped and not missing)
        if not enabled[-1]:
            continue
        inputs = dict(
            positions=bt.positions[:n_tok], query_start_loc=bt.query_start_loc, req_indices=req,
            idx_mapping=_i32(rows, device), block_table=table, block_size=entry, kv_block_size=kv_bs,
            cp_world_size=n, cp_rank=rank % n, cp_interleave=s.cp.interleave,
            is_circular=g.circular, pad_id=PAD_SLOT_ID, max_num_tokens=T,
            cp_sharded=n > 1, world_cp_size=s.cp.world, world_cp_rank=rank,
        )
        prep.launch(g.name)
        with prep.bracket([(gi, "positions", inputs["positions"]), (gi, "query_start_loc", inputs["query_start_loc"]),
                           (gi, "idx_mapping", inputs["idx_mapping"]), (gi, "block table", table)]):
                res = k.obj(**{p: inputs[p] for p in k.params if p in inputs})
        faults[gi] = output_fault(res, device, n_tok, T)
        if faults[gi]:  # judged by the coordinator (kernel-output); the group's row stays POISON
            continue
        m = min(res.numel(), T)
        # the host's buffer holds what the callable returns, cast as a store into it would cast
        out[gi, :m] = res[:m].to(device=device, dtype=_out_dtype(k, s)).to(torch.int64)
        out[gi, max(m, n_tok):] = PAD_SLOT_ID  # the runtime pads what follows the scheduled tokens
    result = RankOutput(out, enabled, widths, entries) if path == "v2" else v1._result(out, s, knobs, enabled)
    result.output_faults = faults
    return result


# What a callable may return wrong, by code (0: a 1-D integer tensor of n_tok..T slots on the device).
# The coordinator words them (``cpsim.check.coordinator.OUTPUT_FAULTS``, same order).
OUTPUT_FAULTS = ("", "not a tensor", "not 1-D", "floating-point", "complex", "bool", "on another device",
                 "shorter than the scheduled tokens", "longer than the slot buffer")


def output_fault(res, device, n_tok: int, T: int) -> int:
    """Which of ``OUTPUT_FAULTS`` a callable's result has (0: none)."""
    if not isinstance(res, torch.Tensor):
        return 1
    if res.dim() != 1:
        return 2
    if res.dtype.is_complex:
        return 4
    if res.dtype.is_floating_point:
        return 3
    if res.dtype == torch.bool:
        return 5
    if res.device.type != torch.device(device).type:
        return 6
    if res.numel() < n_tok:
        return 7
    if res.numel() > T:
        return 8
    return 0


# ---- replay padding: the user's kernel for the pass after the slot mappings -------

def replay(k, s: Scenario, slots: torch.Tensor, qsl: torch.Tensor, positions: torch.Tensor,
           starts: torch.Tensor, groups: list[int], prep: PerRank) -> None:
    """Launch the user's replay-padding kernel ``k`` on one rank's int64 ``[groups, entries]`` buffer,
    in place. ``groups``: the indices the runtime lists as prefix-cacheable (``cpsim.paths.replay_padding``)."""
    device = slots.device
    args = dict(slot_mappings_ptr=slots, group_stride=slots.stride(0), query_start_loc_ptr=qsl,
                positions_ptr=positions, replay_start_ptr=starts, pad_slot_id=PAD_SLOT_ID, BLOCK=TILE)
    args["window" if "window" in k.params else "replay_window"] = s.replay_window
    if k.abi == "vllm-replay-pad":
        args.update(cacheable_groups_ptr=_i32(groups, device), NUM_GROUPS=len(groups))
    else:  # vllm-replay-pad-bits: one bit per group, over every group
        args.update(CACHEABLE_GROUPS=sum(1 << gi for gi in groups), NUM_GROUPS=len(s.groups))
    with prep.bracket([(groups[0] if groups else 0, "positions", positions),
                       (groups[0] if groups else 0, "query_start_loc", qsl)]):
        k.obj[(s.batch.num_reqs,)](**args)


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

import torch

from cpsim import kernels
from cpsim.layout import PAD_SLOT_ID
from cpsim.paths import Knobs, RankOutput, _guard, _intact, v1, v2
from cpsim.paths._inputs import batch_tensors, prepare_triton
from cpsim.scenario import INT32_MAX, KVGroup, Scenario

TILE = 1024
FUSED_PARALLEL_TILES = 2  # cpsim's choice: >1 so the tile-striding loop is exercised


def run(k, path: str, s: Scenario, allocs, rank: int, device: torch.device, knobs: Knobs) -> RankOutput | None:
    if knobs.kernel_fault:
        k.note("fault switches compile into cpsim's built-in kernels only; ignored for the kernel under test")
    if path == "v1-fused" and s.cp.world > 1:
        return None
    if k.abi == "callable":
        out = _callable(k, path, s, allocs, rank, device, knobs)
        _mask_padding(k, s, out)
        return out
    runner = {"ascend-v1": _ascend_v1, "ascend-v1-fused": _ascend_v1_fused,
              "ascend-v1-fused-adaptive": _ascend_v1_fused,
              "ascend-v2": _v2, "vllm-v2": _v2, "vllm-mrv2": _mrv2}[k.abi]
    prepare_triton(device)
    out = runner(k, s, allocs, rank, device, knobs)
    if k.abi != "vllm-mrv2" or "is_padding" not in k.params:
        _mask_padding(k, s, out)
    return out


def _mask_padding(k, s: Scenario, out: RankOutput | None) -> None:
    """An ABI without an is_padding input cannot see padding tokens: the mask is applied on
    the host (as cpsim's v1 paths do) and the kernel is not judged on it."""
    if out is None or not s.batch.has_padding:
        return
    k.note(f"the {k.abi} kernel takes no is_padding input: is_padding tokens were set to PAD on the host "
           f"after the launch, so the kernel is not checked on them")
    v1.mask_padding(s, out.slots)


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


# ---- v1: one launch per group, logical (kernel-block) table -----------------

def _ascend_v1(k, s: Scenario, allocs, rank: int, device, knobs: Knobs) -> RankOutput:
    bt = batch_tensors(s, device)
    out = v1._poisoned(s, knobs, device)
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
        _check_int32(k, g)
        n = g.world(s.cp)
        table = v1._tables(s, g, allocs[gi], knobs, device)
        kv_bs, bpk = v1._sizes(s, g, knobs)
        buf = _guard.buffer([gi], T, torch.int32, device)[0]
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
        _guard.launch(g.name)
        with _intact.bracket([(gi, "positions", bt.positions), (gi, "query_start_loc", qsl),
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


def _ascend_v1_fused(k, s: Scenario, allocs, rank: int, device, knobs: Knobs) -> RankOutput:
    bt = batch_tensors(s, device)
    out = v1._poisoned(s, knobs, device)
    T = out.shape[1]
    has_circular = "is_circular_ptr" in k.params
    groups = []
    for gi, g in enumerate(s.groups):
        if g.slot_mapped and g.circular and not has_circular:
            _skip_circular(k, g)
        elif g.slot_mapped:
            _check_int32(k, g)
            groups.append((gi, g))
    if groups:
        tables = [v1._tables(s, g, allocs[gi], knobs, device) for gi, g in groups]
        bufs = [_guard.buffer([gi], T, torch.int32, device)[0] for gi, _ in groups]
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
        _guard.launch(",".join(g.name for _, g in groups))
        per_group = s.batch.num_reqs + 1 if adaptive else s.batch.num_reqs * FUSED_PARALLEL_TILES + 1
        with _intact.bracket([(groups[0][0], "positions", bt.positions),
                              (groups[0][0], "query_start_loc", args["query_start_loc_ptr"])]
                             + [(gi, "block table", t) for (gi, _), t in zip(groups, tables)]):
            k.obj[(len(groups) * per_group,)](**args)
        for (gi, _), buf in zip(groups, bufs):
            out[gi] = buf.to(torch.int64)
    done = {gi for gi, _ in groups}
    return v1._result(out, s, knobs, [gi in done for gi in range(len(s.groups))])


# ---- v2: physical tables through idx_mapping, one launch per CP size --------

def _v2(k, s: Scenario, allocs, rank: int, device, knobs: Knobs) -> RankOutput:
    bt = batch_tensors(s, device)
    T = knobs.buffer_size or s.limits.slot_buffer_size
    out = _guard.buffer(range(len(s.groups)), T, torch.int64, device)
    tables, entry = zip(*(v2._table(s, g, a, knobs, device) for g, a in zip(s.groups, allocs)))
    has_enabled = "slot_mapping_enabled" in k.params
    launches: dict[tuple[int, int], list[int]] = {}
    for gi, g in enumerate(s.groups):
        if g.circular:
            _skip_circular(k, g)
            continue
        if not g.slot_mapped and not has_enabled:
            k.note(f"group {g.name}: {g.kind} groups have no slot mapping and this {k.abi} kernel has no "
                   f"slot_mapping_enabled flag; group left out of the launch and not checked")
            continue
        n = g.world(s.cp)
        if k.v2_launch == "single":
            key = (s.cp.world, rank)
        elif n > 1:
            key = (n, rank % n)  # a partially replicated group: its own CP size and shard rank
        else:
            key = (1, 0)
            if s.cp.world > 1 and g.slot_mapped:
                k.note(f"group {g.name} is not CP-sharded: launched separately with CP_SIZE=1 (the {k.abi} ABI "
                       f"has no per-group CP size; the runtime's single launch applies CP_SIZE to every group - "
                       f"--kernel-v2-launch single reproduces that)")
        if k.abi == "ascend-v2":
            _check_int32(k, g)
        launches.setdefault(key, []).append(gi)
    dtype = torch.int32 if k.abi == "ascend-v2" else torch.int64
    rows = _i32(s.batch.rows_v2(), device)
    qsl = bt.query_start_loc.clamp(max=T)
    for (n, r), gis in launches.items():
        buf = _guard.buffer(gis, T, dtype, device)
        args = dict(
            max_num_tokens=T, idx_mapping=rows, query_start_loc=qsl, pos=bt.positions,
            block_table_ptrs=torch.tensor([tables[i].data_ptr() for i in gis], dtype=_ptr_dtype(device),
                                          device=device),
            block_table_strides=_i64((tables[i].stride(0) for i in gis), device),
            block_sizes=_i32((entry[i] for i in gis), device),
            slot_mappings_ptr=buf, slot_mappings_stride=buf.stride(0), cp_rank=r,
            CP_SIZE=n, CP_INTERLEAVE=s.cp.interleave, PAD_ID=PAD_SLOT_ID, TRITON_BLOCK_SIZE=TILE,
        )
        if k.abi == "vllm-v2":
            # vLLM's runner hands the kernel positions[:num_tokens], the scheduled (unpadded) count.
            args["num_tokens"] = min(bt.num_scheduled, T)
        if "BLOCK_TABLE_PAD_SIZE" in k.params:
            args["BLOCK_TABLE_PAD_SIZE"] = kernels.next_pow2(max(tables[i].stride(0) for i in gis))
        if "BLOCK_TABLE_WINDOW_SIZE" in k.params:
            args["BLOCK_TABLE_WINDOW_SIZE"] = kernels.window_size(TILE, min(entry[i] for i in gis))
        if has_enabled:
            args["slot_mapping_enabled"] = _i32((int(s.groups[i].slot_mapped) for i in gis), device)
            if "HAS_SLOT_MAPPING_ENABLED" in k.params:
                args["HAS_SLOT_MAPPING_ENABLED"] = True
        _guard.launch(",".join(s.groups[i].name for i in gis))
        with _intact.bracket([(gis[0], "positions", bt.positions), (gis[0], "query_start_loc", qsl),
                              (gis[0], "idx_mapping", rows)] + [(i, "block table", tables[i]) for i in gis]):
            k.obj[(len(gis), s.batch.num_reqs + 1)](**args)
        out[gis] = buf.to(torch.int64)
    done = {gi for gis in launches.values() for gi in gis}
    return RankOutput(out, [gi in done for gi in range(len(s.groups))], [t.shape[1] for t in tables], list(entry))


# ---- vllm-mrv2: kernel-block tables, num_blocks, per-group CP sizes, one launch ----

def _mrv2(k, s: Scenario, allocs, rank: int, device, knobs: Knobs) -> RankOutput:
    bt = batch_tensors(s, device)
    T = knobs.buffer_size or s.limits.slot_buffer_size
    out = _guard.buffer(range(len(s.groups)), T, torch.int64, device)
    tables = [v2.kernel_table(s, g, a, knobs, device) for g, a in zip(s.groups, allocs)]
    nb_all = v2.num_blocks(s, allocs, tables, device)
    has_circular = "is_circular" in k.params
    gis = []
    for gi, g in enumerate(s.groups):
        if g.circular and not has_circular:
            _skip_circular(k, g)
            continue
        gis.append(gi)
    if gis:
        buf = _guard.buffer(gis, T, torch.int64, device)
        nb = nb_all[gis].contiguous()
        args = dict(
            max_num_tokens=T, idx_mapping=_i32(s.batch.rows_v2(), device),
            query_start_loc=bt.query_start_loc.clamp(max=T), pos=bt.positions,
            block_table_ptrs=torch.tensor([tables[i].data_ptr() for i in gis], dtype=_ptr_dtype(device),
                                          device=device),
            block_table_strides=_i64((tables[i].stride(0) for i in gis), device),
            num_blocks_ptr=nb, num_blocks_stride=nb.stride(0),
            block_sizes=_i32((s.groups[i].b if knobs.virtual_from_kernel_block else s.groups[i].block_size
                              for i in gis), device),
            kernel_block_sizes=_i32((s.groups[i].b for i in gis), device),
            group_cp_sizes=_i32((s.groups[i].world(s.cp) for i in gis), device),
            slot_mappings_ptr=buf, slot_mappings_stride=buf.stride(0), cp_rank=rank,
            CP_SIZE=s.cp.world, CP_INTERLEAVE=s.cp.interleave, PAD_ID=PAD_SLOT_ID, TRITON_BLOCK_SIZE=TILE,
        )
        if "is_padding" in k.params:
            args["is_padding"] = v2.padding_flags(s, bt.positions.numel(), device)
        if has_circular:
            args["is_circular"] = _i32((int(s.groups[i].circular) for i in gis), device)
        _guard.launch(",".join(s.groups[i].name for i in gis))
        with _intact.bracket([(gis[0], "positions", bt.positions), (gis[0], "query_start_loc", args["query_start_loc"]),
                              (gis[0], "idx_mapping", args["idx_mapping"])] + [(i, "block table", tables[i]) for i in gis]):
            k.obj[(len(gis), s.batch.num_reqs + 1)](**args)
        out[gis] = buf.to(torch.int64)
    done = set(gis)
    return RankOutput(out, [gi in done for gi in range(len(s.groups))], [t.shape[1] for t in tables],
                      [g.b for g in s.groups])


# ---- callable: a Python function per group ----------------------------------

def _callable(k, path: str, s: Scenario, allocs, rank: int, device, knobs: Knobs) -> RankOutput:
    bt = batch_tensors(s, device)
    out = v1._poisoned(s, knobs, device) if path != "v2" else _guard.buffer(
        range(len(s.groups)), knobs.buffer_size or s.limits.slot_buffer_size, torch.int64, device)
    T = out.shape[1]
    n_tok = bt.num_scheduled
    counts = (bt.query_start_loc[1:] - bt.query_start_loc[:-1]).to(torch.int64)
    req = torch.repeat_interleave(torch.arange(s.batch.num_reqs, device=device), counts)
    widths, entries, enabled = [], [], []
    faults = [0] * len(s.groups)
    for gi, g in enumerate(s.groups):
        if path == "v2":
            table, entry = v2._table(s, g, allocs[gi], knobs, device)
            rows, kv_bs = s.batch.rows_v2(), entry
        else:
            table, entry = v1._tables(s, g, allocs[gi], knobs, device), g.b
            rows, kv_bs = range(s.batch.num_reqs), v1._sizes(s, g, knobs)[0]
        widths.append(table.shape[1])
        entries.append(entry)
        enabled.append(g.slot_mapped)
        if not g.slot_mapped:
            continue
        n = g.world(s.cp)
        inputs = dict(
            positions=bt.positions[:n_tok], query_start_loc=bt.query_start_loc, req_indices=req,
            idx_mapping=_i32(rows, device), block_table=table, block_size=entry, kv_block_size=kv_bs,
            cp_world_size=n, cp_rank=rank % n, cp_interleave=s.cp.interleave,
            is_circular=g.circular, pad_id=PAD_SLOT_ID, max_num_tokens=T,
        )
        _guard.launch(g.name)
        with _intact.bracket([(gi, "positions", inputs["positions"]), (gi, "query_start_loc", inputs["query_start_loc"]),
                              (gi, "idx_mapping", inputs["idx_mapping"]), (gi, "block table", table)]):
                res = k.obj(**{p: inputs[p] for p in k.params if p in inputs})
        faults[gi] = output_fault(res, device, n_tok, T)
        if faults[gi]:  # judged by the coordinator (kernel-output); the group's row stays POISON
            continue
        m = min(res.numel(), T)
        out[gi, :m] = res[:m].to(device=device, dtype=torch.int64)
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
           starts: torch.Tensor, groups: list[int]) -> None:
    """Launch the user's replay-padding kernel ``k`` on one rank's int64 ``[groups, entries]`` buffer,
    in place. ``groups``: the indices the runtime lists as prefix-cacheable (``cpsim.paths.replay``)."""
    device = slots.device
    args = dict(slot_mappings_ptr=slots, group_stride=slots.stride(0), query_start_loc_ptr=qsl,
                positions_ptr=positions, replay_start_ptr=starts, pad_slot_id=PAD_SLOT_ID, BLOCK=TILE)
    args["window" if "window" in k.params else "replay_window"] = s.replay_window
    if k.abi == "vllm-replay-pad":
        args.update(cacheable_groups_ptr=_i32(groups, device), NUM_GROUPS=len(groups))
    else:  # vllm-replay-pad-bits: one bit per group, over every group
        args.update(CACHEABLE_GROUPS=sum(1 << gi for gi in groups), NUM_GROUPS=len(s.groups))
    with _intact.bracket([(groups[0] if groups else 0, "positions", positions),
                          (groups[0] if groups else 0, "query_start_loc", qsl)]):
        k.obj[(s.batch.num_reqs,)](**args)


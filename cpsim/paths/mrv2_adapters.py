"""MRV2 launch adapters: drive a user's kernel through one of the MRV2 ABIs (one launch over the
groups, grid (groups, num_reqs + 1), tables reached through ``idx_mapping``). Dispatched from
:func:`cpsim.paths.adapters.run`."""

from __future__ import annotations

import torch

from cpsim import kernels
from cpsim.kernels.under_test import ABIS
from cpsim.layout import PAD_SLOT_ID
from cpsim.paths import v2
from cpsim.paths.launch_args import (ASCEND_TOTAL_BLOCK_SIZE, TILE, _check_int32, _i32, _i64, _note_dcp_only,
                                     _out_dtype, _physical, _ptr_dtype, _skip_circular, release_shape,
                                     slot_entries)
from cpsim.paths.prep import PerRank
from cpsim.paths.types import Knobs, RankOutput
from cpsim.scenario import Scenario

# Released MRV2 ABIs whose host hands kernel-block tables and block_sizes = the kernel block b (vLLM 0.22-0.28:
# BlockTables widens each table by B/b and block_sizes_tensor is built from kernel_block_sizes; vllm-ascend
# 0.23.0.post1's AscendBlockTables inherits that from vLLM 0.23.0, whose runner passes kernel_block_sizes).
KERNEL_BLOCK_TABLES = ("vllm-mrv2-0.22", "ascend-v2-0.23")


# ---- v2: physical tables through idx_mapping, one launch per CP size --------

def _v2(k, s: Scenario, allocs, rank: int, prep: PerRank, knobs: Knobs) -> RankOutput:
    device = prep.device
    bt, _ = prep.batch()
    T = slot_entries(k, s, knobs, "v2")
    out = prep.buffer(range(len(s.groups)), T, torch.int64)
    if k.abi in KERNEL_BLOCK_TABLES:  # vLLM 0.22-0.28 MRV2: BlockTables holds kernel-block ids, block_sizes = b
        tables, entry = [prep.table(a, release_shape(k, s, g, v2.kernel_table_shape(s, g, knobs)))
                         for g, a in zip(s.groups, allocs)], [g.b for g in s.groups]
    else:
        tables, entry = zip(*(_physical(s, g, a, knobs, prep, k) for g, a in zip(s.groups, allocs)))
    has_enabled = "slot_mapping_enabled" in k.params
    launches: dict[tuple[int, int], list[int]] = {}
    unjudged = set()
    for gi, g in enumerate(s.groups):
        if g.circular:
            _skip_circular(k, g)
            continue
        if not g.slot_mapped and not has_enabled and k.v2_launch == "single" and ABIS[k.abi].releases:
            # the release's BlockTables launches every group, a state group's table too (no flag to skip it)
            k.note(f"group {g.name}: {g.kind} groups have no slot mapping, but the {k.abi} releases launch the "
                   f"kernel over every group: launched with the others, its output not checked")
            unjudged.add(gi)
        elif not g.slot_mapped and not has_enabled:
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
        _check_int32(k, s, g)
        launches.setdefault(key, []).append(gi)
    dtype = _out_dtype(k, s)
    rows = _i32(s.batch.rows_v2(), device)
    qsl = bt.query_start_loc.clamp(max=T)
    for (n, r), gis in launches.items():
        buf = prep.buffer(gis, T, dtype)
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
            # vLLM 0.17.0's MRV2 runner hands compute_slot_mappings positions[:num_tokens_after_padding] and the
            # host passes num_tokens = positions.shape[0]: the graph-padded count (gpu/model_runner.py
            # prepare_inputs, gpu/block_table.py compute_slot_mappings)
            args["num_tokens"] = min(bt.num_tokens, T)
        if "TOTAL_BLOCK_SIZE" in k.params:
            args["TOTAL_BLOCK_SIZE"] = ASCEND_TOTAL_BLOCK_SIZE  # the fixed table window the release passes
        if "BLOCK_TABLE_PAD_SIZE" in k.params:
            args["BLOCK_TABLE_PAD_SIZE"] = kernels.next_pow2(max(tables[i].stride(0) for i in gis))
        if "BLOCK_TABLE_WINDOW_SIZE" in k.params:
            args["BLOCK_TABLE_WINDOW_SIZE"] = kernels.window_size(TILE, min(entry[i] for i in gis))
        if has_enabled:
            args["slot_mapping_enabled"] = _i32((int(s.groups[i].slot_mapped) for i in gis), device)
            if "HAS_SLOT_MAPPING_ENABLED" in k.params:
                args["HAS_SLOT_MAPPING_ENABLED"] = True
        prep.launch(",".join(s.groups[i].name for i in gis))
        with prep.bracket([(gis[0], "positions", bt.positions), (gis[0], "query_start_loc", qsl),
                           (gis[0], "idx_mapping", rows)] + [(i, "block table", tables[i]) for i in gis]):
            k.obj[(len(gis), s.batch.num_reqs + 1)](**args)
        out[gis] = buf.to(torch.int64)
    done = {gi for gis in launches.values() for gi in gis} - unjudged
    return RankOutput(out, [gi in done for gi in range(len(s.groups))], [t.shape[1] for t in tables], list(entry))


# ---- released vLLM MRV2 (0.29-0.33): per-group flag arrays, one launch with the world CP size ----

def _mrv2_tables(s: Scenario, bt, tables, gis: list[int], T: int, device) -> dict:
    """The batch and table-pointer arguments every MRV2 signature shares (the groups ``gis``)."""
    return dict(
        max_num_tokens=T, idx_mapping=_i32(s.batch.rows_v2(), device),
        query_start_loc=bt.query_start_loc.clamp(max=T), pos=bt.positions,
        block_table_ptrs=torch.tensor([tables[i].data_ptr() for i in gis], dtype=_ptr_dtype(device),
                                      device=device),
        block_table_strides=_i64((tables[i].stride(0) for i in gis), device),
    )


def _mrv2_flags(k, s: Scenario, allocs, rank: int, prep: PerRank, knobs: Knobs) -> RankOutput:
    """As vLLM's ``BlockTables.compute_slot_mappings``: one launch over every group, grid
    (num_groups, num_reqs + 1), ``CP_SIZE`` = the DCP size for every group and ``cp_rank`` the DCP rank
    (the runner passes ``dcp_size`` / ``dcp_rank``; PCP does not shard KV), per-group
    ``slot_mapping_enabled`` (true for state groups too: 0.29-0.30 enable every group but circular ones,
    0.31+ read ``uses_slot_mapping``, true for ``MambaSpec``) and from 0.31 ``dcp_sharded`` (sharded
    over all of DCP or replicated; false for state groups),
    ``max_num_tokens`` = the buffer's width, int64. 0.29-0.31 tables hold kernel-block ids
    (``kernel_block_sizes``), 0.32+ physical ids."""
    device = prep.device
    bt, _ = prep.batch()
    T = slot_entries(k, s, knobs, "v2")
    out = prep.buffer(range(len(s.groups)), T, torch.int64)
    kernel_blocks = "kernel_block_sizes" in k.params
    if kernel_blocks:
        tables = [prep.table(a, release_shape(k, s, g, v2.kernel_table_shape(s, g, knobs)))
                  for g, a in zip(s.groups, allocs)]
        entry = [g.b for g in s.groups]
    else:
        tables, entry = map(list, zip(*(_physical(s, g, a, knobs, prep, k) for g, a in zip(s.groups, allocs))))
    has_sharded = "dcp_sharded" in k.params
    _note_dcp_only(k, s)
    gis = []
    dcp = s.cp.dcp
    for gi, g in enumerate(s.groups):
        n = g.world(s.cp)
        if g.circular:
            k.note(f"group {g.name}: a ring is the release's CircularBufferSpec, launched with "
                   f"slot_mapping_enabled false (no vLLM release has a ring slot rule): PAD expected")
            gis.append(gi)
        elif 1 < n < s.cp.world and n != dcp:
            k.note(f"group {g.name}: a partial replica (CP size {n} of {s.cp.world}) has no counterpart in vLLM, "
                   f"whose groups are sharded over all of DCP or replicated; group not checked")
        else:
            if n == 1 and dcp > 1 and not has_sharded:
                k.note(f"group {g.name} is {'replicated' if g.slot_mapped else 'a state group'}, but the {k.abi} "
                       f"ABI has no dcp_sharded flag: launched with CP_SIZE={dcp} for every group, as that "
                       f"release's runtime does")
            gis.append(gi)
    if gis:
        buf = prep.buffer(gis, T, _out_dtype(k, s))
        args = dict(
            **_mrv2_tables(s, bt, tables, gis, T, device),
            block_sizes=_i32((s.groups[i].b if knobs.virtual_from_kernel_block else s.groups[i].block_size
                              for i in gis) if kernel_blocks else (entry[i] for i in gis), device),
            slot_mapping_enabled=torch.tensor([not s.groups[i].circular for i in gis], dtype=torch.bool,
                                              device=device),
            slot_mappings_ptr=buf, slot_mappings_stride=buf.stride(0), cp_rank=rank % dcp,
            CP_SIZE=dcp, CP_INTERLEAVE=s.cp.interleave, PAD_ID=PAD_SLOT_ID, TRITON_BLOCK_SIZE=TILE,
        )
        if kernel_blocks:
            args["kernel_block_sizes"] = _i32((s.groups[i].b for i in gis), device)
        if has_sharded:
            args["dcp_sharded"] = torch.tensor([s.groups[i].world(s.cp) > 1 for i in gis], dtype=torch.bool,
                                               device=device)
        prep.launch(",".join(s.groups[i].name for i in gis))
        with prep.bracket([(gis[0], "positions", args["pos"]), (gis[0], "query_start_loc", args["query_start_loc"]),
                           (gis[0], "idx_mapping", args["idx_mapping"])] + [(i, "block table", tables[i]) for i in gis]):
            k.obj[(len(gis), s.batch.num_reqs + 1)](**args)
        out[gis] = buf.to(torch.int64)
    done = set(gis)
    return RankOutput(out, [gi in done for gi in range(len(s.groups))], [t.shape[1] for t in tables], entry)


# ---- cpsim-mrv2: kernel-block tables, num_blocks, per-group CP sizes, one launch ----

def _mrv2(k, s: Scenario, allocs, rank: int, prep: PerRank, knobs: Knobs) -> RankOutput:
    device = prep.device
    bt, _ = prep.batch()
    T = knobs.buffer_entries(s, "v2")
    out = prep.buffer(range(len(s.groups)), T, torch.int64)
    tables = [prep.table(a, v2.kernel_table_shape(s, g, knobs)) for g, a in zip(s.groups, allocs)]
    nb_all = v2.num_blocks(s, allocs, tables, device)
    has_circular = "is_circular" in k.params
    gis = []
    for gi, g in enumerate(s.groups):
        if g.circular and not has_circular:
            _skip_circular(k, g)
            continue
        gis.append(gi)
    if gis:
        buf = prep.buffer(gis, T, _out_dtype(k, s))
        nb = nb_all[gis].contiguous()
        args = dict(
            **_mrv2_tables(s, bt, tables, gis, T, device),
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
        prep.launch(",".join(s.groups[i].name for i in gis))
        with prep.bracket([(gis[0], "positions", bt.positions), (gis[0], "query_start_loc", args["query_start_loc"]),
                           (gis[0], "idx_mapping", args["idx_mapping"])] + [(i, "block table", tables[i]) for i in gis]):
            k.obj[(len(gis), s.batch.num_reqs + 1)](**args)
        out[gis] = buf.to(torch.int64)
    done = set(gis)
    return RankOutput(out, [gi in done for gi in range(len(s.groups))], [t.shape[1] for t in tables],
                      [g.b for g in s.groups])

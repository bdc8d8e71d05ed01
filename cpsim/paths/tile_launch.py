"""Tile-parallel launches for the v1 and v2 paths (``Knobs.kernel_design == "tile"``).

Same inputs as the per-request launches in ``v1.py`` / ``v2.py``; only the
kernel and the grid differ, so either design can be checked against the other.
"""

from __future__ import annotations

import torch

from cpsim.kernels.select import tile_kernels
from cpsim.kernels.tile import plan, pow2_sizes
from cpsim.layout import PAD_SLOT_ID
from cpsim.scenario import KVGroup, Scenario
from cpsim.kernels import next_pow2


def _plan(s: Scenario, max_num_tokens: int, device: torch.device):
    return plan(max_num_tokens, s.limits.max_num_reqs, s.limits.max_model_len, device.type)


def launch_v1(s: Scenario, g: KVGroup, num_tokens: int, qsl: torch.Tensor, positions: torch.Tensor,
              table: torch.Tensor, out: torch.Tensor, kv_bs: int, bpk: int, rank: int, fault: int) -> None:
    n = g.world(s.cp)
    p = _plan(s, out.shape[0], out.device)
    tile_kernels(out.device.type).v1[p.grid(out.shape[0])](
        num_tokens, out.shape[0], s.batch.num_reqs, qsl, positions, table, table.stride(0), g.b, out,
        KV_CACHE_BLOCK_SIZE=kv_bs, BLOCKS_PER_KV_BLOCK=bpk, TOTAL_CP_WORLD_SIZE=n,
        TOTAL_CP_RANK=rank % n, CP_KV_CACHE_INTERLEAVE_SIZE=s.cp.interleave, PAD_ID=PAD_SLOT_ID,
        TILE=p.tile, REQ_BLOCK=p.req_block, IS_CIRCULAR=g.circular, FAULT=fault, POS_INT32=p.pos_int32,
        num_warps=p.num_warps,
    )


def launch_v1_fused(s: Scenario, num_tokens: int, qsl: torch.Tensor, positions: torch.Tensor,
                    ptrs: torch.Tensor, strides: torch.Tensor, sizes: torch.Tensor, circular: torch.Tensor,
                    view: torch.Tensor, fault: int) -> None:

    p = _plan(s, view.shape[1], view.device)
    tile_kernels(view.device.type).v1_fused[p.grid(view.shape[1])](
        num_tokens, view.shape[1], s.batch.num_reqs, qsl, positions, ptrs, strides, sizes, circular,
        view, view.stride(0), PAD_ID=PAD_SLOT_ID, TILE=p.tile, REQ_BLOCK=p.req_block,
        NUM_GROUPS=view.shape[0], GROUP_BLOCK=next_pow2(view.shape[0]), FAULT=fault,
        POS_INT32=p.pos_int32, POW2=pow2_sizes(sizes.tolist()), num_warps=p.num_warps,
    )


def launch_v2(s: Scenario, args: tuple, enabled, cp_sizes, circular, out: torch.Tensor, fault: int) -> None:
    """``args``: the per-request kernel's positional arguments up to ``cp_rank``."""

    num_tokens, max_num_tokens, *rest = args
    p = _plan(s, max_num_tokens, out.device)
    G = out.shape[0]
    tile_kernels(out.device.type).v2[p.grid(max_num_tokens)](
        num_tokens, max_num_tokens, s.batch.num_reqs, *rest,
        CP_SIZE=s.cp.world, CP_INTERLEAVE=s.cp.interleave, PAD_ID=PAD_SLOT_ID, TRITON_BLOCK_SIZE=p.tile,
        slot_mapping_enabled=enabled, group_cp_sizes=cp_sizes, is_circular=circular,
        NUM_GROUPS=G, GROUP_BLOCK=next_pow2(G), REQ_BLOCK=p.req_block, FAULT=fault, POS_INT32=p.pos_int32,
        POW2=pow2_sizes(rest[5].tolist(), s.cp.world), num_warps=p.num_warps,
    )

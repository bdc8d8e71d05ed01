"""Callables that leave out an input a group needs (cpsim's tests of "not checked: ask for X")."""

import torch


def _plain(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size, n, cp_rank,
           cp_interleave, pad_id):
    span = kv_block_size * n
    vo = positions % span
    mine = (vo // cp_interleave) % n == cp_rank
    local = (vo // (n * cp_interleave)) * cp_interleave + vo % cp_interleave
    idx = (positions // span) * (kv_block_size // block_size) + local // block_size
    rows = idx_mapping.to(torch.int64)[req_indices]
    width = block_table.shape[1]
    ok = mine & (rows >= 0) & (idx < width)
    flat = block_table.reshape(-1).to(torch.int64)
    blk = flat[(rows.clamp(min=0) * width + idx.clamp(max=width - 1)) * ok]
    return torch.where(ok, blk * block_size + local % block_size, torch.full_like(positions, pad_id))


def no_circular(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                cp_world_size, cp_rank, cp_interleave, pad_id):
    """Right for plain tables; never asks whether the table is a ring."""
    return _plain(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size, cp_world_size,
                  cp_rank, cp_interleave, pad_id)


def ignores_circular(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                     cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    """Asks for is_circular and ignores it: judged, and wrong on ring groups."""
    return _plain(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size, cp_world_size,
                  cp_rank, cp_interleave, pad_id)


def world_only(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
               world_cp_size, world_cp_rank, cp_interleave, is_circular, pad_id):
    """Shards every group over the world CP size, as upstream's kernels read CP_SIZE; no sharded flag."""
    if is_circular:
        return torch.where(positions >= 0, block_table.to(torch.int64)[idx_mapping.to(torch.int64)[req_indices], 0]
                           * block_size + positions % block_size, torch.full_like(positions, pad_id))
    return _plain(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size, world_cp_size,
                  world_cp_rank, cp_interleave, pad_id)


def world_ignores_flag(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                       world_cp_size, world_cp_rank, cp_interleave, is_circular, cp_sharded, pad_id):
    """Asks for cp_sharded and ignores it (vLLM #57260's shape): judged, and wrong on replicated groups."""
    return world_only(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                      world_cp_size, world_cp_rank, cp_interleave, is_circular, pad_id)

"""A callable-ABI kernel whose only defect is int32 slot arithmetic, for `cpsim fuzz` tests.

Correct for every cache whose slot ids stay below 2^31 (the default fuzz space); the
product ``block * block_size`` wraps once slots pass 2^31 (``--extreme`` finds it).
"""

import torch


def slot_mapping(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                 cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    n, inter = cp_world_size, cp_interleave
    span = kv_block_size * n
    vo = positions % span
    mine = (vo // inter) % n == cp_rank
    local = (vo // (n * inter)) * inter + vo % inter
    idx = (positions // span) * (kv_block_size // block_size) + local // block_size
    off = local % block_size
    if is_circular:
        idx, off, mine = torch.zeros_like(positions), positions % block_size, positions >= 0
    rows = idx_mapping.to(torch.int64)[req_indices]
    width = block_table.shape[1]
    ok = mine & (rows >= 0) & (idx < width)
    flat = block_table.reshape(-1).to(torch.int64)
    blk = flat[(rows.clamp(min=0) * width + idx.clamp(max=width - 1)) * ok]
    slot = blk.to(torch.int32) * block_size + off.to(torch.int32)  # BUG: int32 product wraps past 2^31
    return torch.where(ok, slot, torch.full_like(positions, pad_id))

"""A minimal slot-mapping function in cpsim's callable ABI: plain torch, a skeleton to start from.

cpsim calls it once per KV-cache group and CP rank with the inputs its parameter
names ask for, and expects one slot (or pad_id) per scheduled token. Under
`--kernel-v1` block_table is the logical kernel-block table, under `--kernel-v2`
the physical one; idx_mapping gives each batch entry its table row.

    cpsim run --kernel-v1 examples/my_slots.py:my_slots
"""

import torch


def my_slots(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
             cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    n, inter = cp_world_size, cp_interleave
    span = kv_block_size * n                       # one virtual block: a physical block on each rank
    in_span = positions % span
    mine = (in_span // inter) % n == cp_rank       # the owner rule (p // I) % N
    j = (in_span // (n * inter)) * inter + in_span % inter
    idx = (positions // span) * (kv_block_size // block_size) + j // block_size
    off = j % block_size
    if is_circular:                                # a sliding-window ring: every rank holds every token
        idx, off, mine = torch.zeros_like(positions), positions % block_size, positions >= 0
    rows = idx_mapping.to(torch.int64)[req_indices]
    blocks = block_table.to(torch.int64)[rows, idx.clamp(0, block_table.shape[1] - 1)]
    return torch.where(mine, blocks * block_size + off, torch.full_like(positions, pad_id))

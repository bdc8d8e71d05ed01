"""The v1 DCP path in torch, as production runs it when DCP > 1.

Written from the formula, independently of ``cpsim.layout`` (which the
coordinator uses), so that agreement between the two means something.
"""

from __future__ import annotations

import torch


def compute_dcp_slot_mapping(req_indices: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
                             kernel_block_size: int, kv_block_size: int, world: int, rank: int,
                             interleave: int, pad_id: int = -1) -> torch.Tensor:
    """Slots of the scheduled tokens (no padding) against a logical block table."""
    bpk = kv_block_size // kernel_block_size
    virtual = kv_block_size * world
    vblock = positions // virtual
    voff = positions % virtual
    is_local = (voff // interleave) % world == rank
    local = (voff // (world * interleave)) * interleave + voff % interleave
    logical = vblock * bpk + local // kernel_block_size
    width = block_table.shape[1]
    inside = logical < width
    flat = req_indices * width + logical.clamp(max=width - 1)
    blocks = block_table.reshape(-1).to(torch.int64)[flat]
    slots = blocks * kernel_block_size + local % kernel_block_size
    # past the row's end (a tail group narrower than the sequence) nothing is read: PAD
    return torch.where(is_local & inside, slots, torch.full_like(slots, pad_id))

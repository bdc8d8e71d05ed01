"""A fake MRV2 host of our own in vLLM's layout (``vllm/v1/worker/gpu/block_table.py`` ``BlockTables`` and the
runner's call), for the conformance tests: ``kernel_blocks`` as 0.22-0.28 (tables widened by B/b, each
physical id q written as q*BPK .. q*BPK+BPK-1, ``block_sizes`` = the kernel block sizes), ``num_tokens_arg``
as 0.17.0 (``num_tokens = positions.shape[0]`` first, the runner slicing positions to the graph-padded count).
The kernel is looked up in this module at launch time, as the releases do."""

from __future__ import annotations

import torch

_compute_slot_mappings_kernel = None  # the tests put a recorder here


class BlockTables:
    def __init__(self, block_sizes, kernel_block_sizes, max_num_reqs, max_num_batched_tokens, widths, cp_size,
                 cp_rank, cp_interleave, kernel_blocks: bool, num_tokens_arg: bool):
        self.bpk = [b // k if kernel_blocks else 1 for b, k in zip(block_sizes, kernel_block_sizes)]
        self.tables = [torch.zeros((max_num_reqs, w * n), dtype=torch.int32) for w, n in zip(widths, self.bpk)]
        self.ptrs = torch.tensor([t.data_ptr() for t in self.tables], dtype=torch.uint64)
        self.strides = torch.tensor([t.stride(0) for t in self.tables], dtype=torch.int64)
        self.sizes = torch.tensor(kernel_block_sizes if kernel_blocks else block_sizes, dtype=torch.int32)
        self.slot_mappings = torch.zeros(len(block_sizes), max_num_batched_tokens, dtype=torch.int64)
        self.cp = (cp_size, cp_rank, cp_interleave)
        self.num_tokens_arg = num_tokens_arg

    def append_block_ids(self, row: int, ids_per_group) -> None:
        for table, bpk, ids in zip(self.tables, self.bpk, ids_per_group):
            ids = [q * bpk + j for q in ids for j in range(bpk)]
            table[row, :len(ids)] = torch.tensor(ids, dtype=torch.int32)

    def compute_slot_mappings(self, idx_mapping, query_start_loc, positions):
        head = (positions.shape[0],) if self.num_tokens_arg else ()
        _compute_slot_mappings_kernel[(len(self.tables), idx_mapping.shape[0] + 1)](
            *head, self.slot_mappings.shape[1], idx_mapping, query_start_loc, positions, self.ptrs, self.strides,
            self.sizes, self.slot_mappings, self.slot_mappings.stride(0), self.cp[1],
            CP_SIZE=self.cp[0], CP_INTERLEAVE=self.cp[2], PAD_ID=-1, TRITON_BLOCK_SIZE=1024)


def run_step(tables: BlockTables, rows, blocks, query_start_loc, positions, num_tokens_after_padding: int) -> None:
    """The runner's step: every request's block ids into its row, then the slot mappings over
    ``positions[:num_tokens_after_padding]`` (gpu/model_runner.py prepare_inputs / prepare_attn)."""
    for i, row in enumerate(rows):
        if row >= 0:
            tables.append_block_ids(row, [group[i] for group in blocks])
    tables.compute_slot_mappings(torch.tensor(rows, dtype=torch.int32),
                                 torch.tensor(query_start_loc, dtype=torch.int32),
                                 torch.tensor(positions[:num_tokens_after_padding], dtype=torch.int64))

"""Host block-table classes of our own in vllm-ascend's v1 shape (constructor arguments and arithmetic
as read from vllm_ascend/worker/block_table.py; the code is ours). The three switches are the
three host bugs upstream shipped and fixed; every one on is the correct behaviour:

- MAMBA_WIDTH_TIMES_CP (vllm-ascend #9724): a mamba group's width is cdiv(max_model_len, B x DCP)
  like attention's unless multiplied back by DCP (mamba state is not sharded);
- MTP_DRAFT_RESERVE (vllm-ascend #14024): the slot buffer holds (num_speculative_tokens - 1) x
  max_num_reqs draft entries beyond max_num_batched_tokens;
- KV_BLOCK_IN_VIRTUAL_BLOCK (vllm-ascend #10442): the DCP virtual block is the KV (physical) block
  size x DCP, not the kernel block size x DCP.
"""

import numpy as np
import torch

NAME = "ascend_shape (correct)"
PAD_SLOT_ID = -1
MAMBA_WIDTH_TIMES_CP = True
MTP_DRAFT_RESERVE = True
KV_BLOCK_IN_VIRTUAL_BLOCK = True


def cdiv(a, b):
    return -(-a // b)


class Group:
    def __init__(self, world_size, rank_in_group, group):
        self.world_size, self.rank_in_group, self.device_group = world_size, rank_in_group, group


_DCP = None  # set under torchrun by init_distributed; in the virtual world the adapter answers per rank


def init_distributed(world_size, rank, init_method, dcp, timeout_s):
    """Our groups, as a runtime sets them up: one gloo world, DCP groups of consecutive ranks."""
    global _DCP
    from datetime import timedelta
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init_method, world_size=world_size, rank=rank,
                            timeout=timedelta(seconds=timeout_s))
    groups = [dist.new_group(list(range(first, first + dcp))) for first in range(0, world_size, dcp)]
    _DCP = Group(dcp, rank % dcp, groups[rank // dcp])


def destroy_distributed():
    import torch.distributed as dist
    dist.destroy_process_group()


def get_dcp_group():
    if _DCP is None:
        raise AssertionError("the adapter answers the DCP group per rank")
    return _DCP


class AttentionSpec:
    pass


class MambaSpec:
    pass


class Buffer:
    def __init__(self, *size, dtype, fill=0):
        self.cpu = torch.full(size, fill, dtype=dtype)
        self.gpu = self.cpu  # one tensor on a CPU host (the release's CpuGpuBuffer has two halves)
        self.np = self.cpu.numpy()


class BlockTable:
    def __init__(self, block_size, max_num_reqs, max_num_blocks_per_req, max_num_batched_tokens, pin_memory,
                 device, kernel_sizes=None, cp_kv_cache_interleave_size=1, num_speculative_tokens=0,
                 kv_cache_group=None):
        cfg = globals()
        group = cfg["get_dcp_group"]()
        self.dcp_world_size, self.dcp_rank = group.world_size, group.rank_in_group
        self.pcp_world_size, self.pcp_rank = 1, 0
        self.max_num_reqs, self.max_num_batched_tokens = max_num_reqs, max_num_batched_tokens
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)
        self.is_mamba_group = isinstance(getattr(kv_cache_group, "kv_cache_spec", None), MambaSpec)
        if self.is_mamba_group and self.dcp_world_size > 1 and cfg["MAMBA_WIDTH_TIMES_CP"]:
            max_num_blocks_per_req *= self.dcp_world_size
        kernel = next((k for k in (kernel_sizes or []) if k > 0 and block_size % k == 0), block_size)
        self.physical_block_size, self.block_size = block_size, kernel
        self.blocks_per_phys_block = block_size // kernel
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.cp_kv_cache_interleave_size = cp_kv_cache_interleave_size
        self.block_table = Buffer(max_num_reqs, max_num_blocks_per_req * self.blocks_per_phys_block,
                                  dtype=torch.int32)
        reserve = max(num_speculative_tokens - 1, 0) * max_num_reqs if cfg["MTP_DRAFT_RESERVE"] else 0
        self.slot_mapping = Buffer(max_num_batched_tokens + reserve, dtype=torch.int64, fill=PAD_SLOT_ID)

    def add_row(self, block_ids, row):
        ids = torch.tensor(block_ids, dtype=torch.int64)
        if self.blocks_per_phys_block > 1:
            ids = (ids[:, None] * self.blocks_per_phys_block + torch.arange(self.blocks_per_phys_block)).reshape(-1)
        self.block_table.cpu[row].zero_()
        self.block_table.cpu[row, : ids.numel()] = ids.to(torch.int32)
        self.num_blocks_per_row[row] = ids.numel()

    def compute_slot_mapping(self, num_reqs, query_start_loc, positions):
        n = positions.shape[0]
        reqs = torch.repeat_interleave(torch.arange(num_reqs), (query_start_loc[1:] - query_start_loc[:-1]).long())
        world, rank, inter = self.dcp_world_size, self.dcp_rank, self.cp_kv_cache_interleave_size
        size = self.physical_block_size if globals()["KV_BLOCK_IN_VIRTUAL_BLOCK"] else self.block_size
        virtual = size * world
        vblock, voff = positions // virtual, positions % virtual
        mine = (voff // inter) % world == rank
        local = voff // (world * inter) * inter + voff % inter
        index = vblock * self.blocks_per_phys_block + local // self.block_size
        index = index.clamp(max=self.block_table.cpu.shape[1] - 1)
        ids = self.block_table.cpu[reqs, index].long()
        slots = torch.where(mine, ids * self.block_size + local % self.block_size, PAD_SLOT_ID)
        self.slot_mapping.cpu.fill_(PAD_SLOT_ID)
        self.slot_mapping.cpu[:n] = slots


class MultiGroupBlockTable:
    def __init__(self, max_num_reqs, max_model_len, max_num_batched_tokens, pin_memory, device, block_sizes,
                 num_speculative_tokens=0, max_num_blocks=None, kernel_sizes=None, cp_kv_cache_interleave_size=1,
                 kv_cache_groups=None):
        dcp = globals()["get_dcp_group"]().world_size
        if max_num_blocks is None:
            max_num_blocks = [cdiv(max_model_len, b * dcp) for b in block_sizes]
        kernel_sizes = kernel_sizes or [[0]] * len(block_sizes)
        groups = kv_cache_groups or [None] * len(block_sizes)
        self.block_tables = [BlockTable(b, max_num_reqs, w, max_num_batched_tokens, pin_memory, device, k,
                                        cp_kv_cache_interleave_size, num_speculative_tokens, g)
                             for b, w, k, g in zip(block_sizes, max_num_blocks, kernel_sizes, groups)]

    def add_row(self, block_ids, row):
        for bt, ids in zip(self.block_tables, block_ids):
            bt.add_row(ids, row)

    def commit_block_table(self, num_reqs):
        pass

    def compute_slot_mapping(self, num_reqs, query_start_loc, positions):
        for bt in self.block_tables:
            if not bt.is_mamba_group:
                bt.compute_slot_mapping(num_reqs, query_start_loc, positions)

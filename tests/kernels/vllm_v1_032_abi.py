"""A slot-mapping kernel in vLLM 0.32-0.33's v1 ABI (``vllm-v1-0.32``), written for cpsim's tests.

As in those releases the kernel is the static method ``kernel`` of a launcher class (the class
or an instance of it stands for the kernel); parameter list and launch as theirs (grid
``(num_reqs + 1,)``, physical table, ``KV_CACHE_BLOCK_SIZE`` = B, int64 output); our own body.
"""

import triton
import triton.language as tl


class SlotMappingLauncher:
    @staticmethod
    @triton.jit
    def kernel(
        num_tokens,
        max_num_tokens,
        query_start_loc_ptr,
        positions_ptr,
        block_table_ptr,
        block_table_stride,
        slot_mapping_ptr,
        KV_CACHE_BLOCK_SIZE: tl.constexpr,
        TOTAL_CP_WORLD_SIZE: tl.constexpr,
        TOTAL_CP_RANK: tl.constexpr,
        CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
        PAD_ID: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
    ):
        req = tl.program_id(0)
        if req == tl.num_programs(0) - 1:
            for i in range(num_tokens, max_num_tokens, BLOCK_SIZE):
                offs = i + tl.arange(0, BLOCK_SIZE)
                tl.store(slot_mapping_ptr + offs, tl.full((BLOCK_SIZE,), PAD_ID, tl.int64),
                         mask=offs < max_num_tokens)
            return
        start = tl.load(query_start_loc_ptr + req).to(tl.int64)
        end = tl.load(query_start_loc_ptr + req + 1).to(tl.int64)
        row = block_table_ptr + req.to(tl.int64) * block_table_stride
        for i in range(start, end, BLOCK_SIZE):
            offs = i + tl.arange(0, BLOCK_SIZE)
            mask = offs < end
            p = tl.load(positions_ptr + offs, mask=mask, other=0).to(tl.int64)
            chunk = p // CP_KV_CACHE_INTERLEAVE_SIZE
            mine = chunk % TOTAL_CP_WORLD_SIZE == TOTAL_CP_RANK
            local = (chunk // TOTAL_CP_WORLD_SIZE) * CP_KV_CACHE_INTERLEAVE_SIZE + p % CP_KV_CACHE_INTERLEAVE_SIZE
            ok = mask & mine
            blk = tl.load(row + local // KV_CACHE_BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
            slot = tl.where(ok, blk * KV_CACHE_BLOCK_SIZE + local % KV_CACHE_BLOCK_SIZE, PAD_ID)
            tl.store(slot_mapping_ptr + offs, slot, mask=mask)


LAUNCHER = SlotMappingLauncher()

"""A minimal slot-mapping kernel in vllm-ascend's v1 ABI (`ascend-v1`): a skeleton to start from.

cpsim recognises the ABI from the parameter names. It launches the kernel once per
KV-cache group and CP rank with grid (num_reqs + 1,): program r < num_reqs maps the
tokens of request r, the last program writes PAD_ID from the last scheduled token to
max_num_tokens. block_table holds logical kernel-block ids, one row per request; the
output is int32.

    cpsim run --kernel-v1 examples/my_v1_kernel.py:slot_mapping_kernel
"""

import triton
import triton.language as tl


@triton.jit
def slot_mapping_kernel(
    num_tokens,
    max_num_tokens,
    query_start_loc_ptr,
    positions_ptr,
    block_table_ptr,
    block_table_stride,
    block_size,                             # kernel block b (slots per table entry)
    slot_mapping_ptr,
    KV_CACHE_BLOCK_SIZE: tl.constexpr,      # physical block B
    BLOCKS_PER_KV_BLOCK: tl.constexpr,      # B // b
    TOTAL_CP_WORLD_SIZE: tl.constexpr,      # N
    TOTAL_CP_RANK: tl.constexpr,
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,  # I
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
    BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
):
    req = tl.program_id(0)
    start = tl.load(query_start_loc_ptr + req)
    if req == tl.num_programs(0) - 1:  # the padding program
        for i in range(start, max_num_tokens, TILE_BLOCK_SIZE):
            offs = i + tl.arange(0, TILE_BLOCK_SIZE)
            tl.store(slot_mapping_ptr + offs, tl.full((TILE_BLOCK_SIZE,), PAD_ID, tl.int32),
                     mask=offs < max_num_tokens)
        return
    end = tl.load(query_start_loc_ptr + req + 1)
    row = block_table_ptr + req.to(tl.int64) * block_table_stride
    for i in range(start, end, TILE_BLOCK_SIZE):
        offs = i + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offs < end
        pos = tl.load(positions_ptr + offs, mask=mask, other=0).to(tl.int64)
        # A virtual block of B * N positions spans one physical block on each rank;
        # inside it, position p belongs to rank (p // I) % N.
        span = KV_CACHE_BLOCK_SIZE * TOTAL_CP_WORLD_SIZE
        in_span = pos % span
        mine = (in_span // CP_KV_CACHE_INTERLEAVE_SIZE) % TOTAL_CP_WORLD_SIZE == TOTAL_CP_RANK
        # j: how many positions of this span before p the rank owns
        rounds = in_span // (TOTAL_CP_WORLD_SIZE * CP_KV_CACHE_INTERLEAVE_SIZE)
        j = rounds * CP_KV_CACHE_INTERLEAVE_SIZE + in_span % CP_KV_CACHE_INTERLEAVE_SIZE
        idx = (pos // span) * BLOCKS_PER_KV_BLOCK + j // block_size
        ok = mask & mine
        blk = tl.load(row + idx, mask=ok, other=0).to(tl.int64)
        slot = tl.where(ok, blk * block_size + j % block_size, PAD_ID)
        tl.store(slot_mapping_ptr + offs, slot.to(tl.int32), mask=mask)

"""The vLLM 0.32-0.33 v1 launcher-class form with the module-level imports released files of
that era make (needs vLLM or ``--shim-vllm``); our own body, in the ``vllm-v1-0.32`` ABI."""

from vllm.distributed import get_dcp_group, get_pcp_group  # noqa: F401  (host code only)
from vllm.logger import init_logger
from vllm.model_executor.warmup.jit_warmup import kernel_launcher
from vllm.model_executor.warmup.jit_warmup_triton_helper import (  # noqa: F401
    LaunchSpec,
    TritonWarmupTensor,
    VllmTritonJitKernel,
    triton_scalar_specialization_rep,
)
from vllm.triton_utils import tl, triton
from vllm.utils.math_utils import cdiv  # noqa: F401
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.utils import CpuGpuBuffer  # noqa: F401

logger = init_logger(__name__)


class SlotLauncher(VllmTritonJitKernel["SlotLauncher.Key"]):
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

    @kernel_launcher
    def __call__(self, *args):
        return (1,), {"PAD_ID": PAD_SLOT_ID}


_SLOT_LAUNCHER = SlotLauncher()

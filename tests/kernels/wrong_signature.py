"""A kernel whose parameters match no ABI: cpsim must say which parameters it expected."""

import triton
import triton.language as tl


@triton.jit
def _compute_slot_mapping_kernel(num_tokens, positions_ptr, block_table_ptr, slot_mapping_ptr,
                                 BLOCK: tl.constexpr):
    pass

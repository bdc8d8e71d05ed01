"""Triton helpers of the vLLM shim; a real file because Triton reads a kernel's source."""

import triton
import triton.language as tl


@triton.jit
def _load_ptr(ptr_to_ptr, elem_dtype):
    """Read a device pointer stored in a pointer table and type it (vLLM's helper, same contract)."""
    ptr = tl.load(ptr_to_ptr)
    ptr = tl.cast(ptr, tl.pointer_type(elem_dtype))
    return tl.multiple_of(ptr, 16)

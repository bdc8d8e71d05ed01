"""``--shim-vllm``: the few vLLM names a slot-mapping kernel file imports, taken from Triton.

A kernel file from a vllm-ascend checkout does ``from vllm.triton_utils import tl, triton``
and ``from vllm.v1.worker.gpu.block_table import _load_ptr``; with these in-memory
modules it loads without vLLM installed. An installed vLLM is never shadowed.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types

SHIM_MODULES = (
    "vllm", "vllm.triton_utils", "vllm.v1", "vllm.v1.worker", "vllm.v1.worker.gpu",
    "vllm.v1.worker.gpu.block_table", "vllm.v1.worker.gpu.buffer_utils",
)


def installed() -> bool:
    return getattr(sys.modules.get("vllm"), "__cpsim_shim__", False)


def install() -> bool:
    """Provide the shim modules; False when a real vLLM is importable (it is used instead)."""
    if installed():
        return True
    if "vllm" in sys.modules or importlib.util.find_spec("vllm") is not None:
        return False
    from cpsim import kernels
    kernels.import_triton()
    import triton
    import triton.language as tl

    from cpsim.kernels import _vllm_shim_jit

    mods = {}
    for name in SHIM_MODULES:
        m = types.ModuleType(name, "cpsim --shim-vllm stand-in (not vLLM)")
        m.__cpsim_shim__ = True
        m.__path__ = []  # a package, so submodule imports resolve through sys.modules
        mods[name] = m
    tu = mods["vllm.triton_utils"]
    tu.HAS_TRITON = True
    tu.triton, tu.tl = triton, tl
    tu.LOG2E, tu.LOGE2 = math.log2(math.e), math.log(2)
    try:
        from triton.language.extra import libdevice
        tu.tldevice = libdevice
    except ImportError:
        pass
    names = ["HAS_TRITON", "triton", "tl", "LOG2E", "LOGE2"] + (["tldevice"] if hasattr(tu, "tldevice") else [])
    tu.__all__ = names
    for name in ("vllm.v1.worker.gpu.block_table", "vllm.v1.worker.gpu.buffer_utils"):
        mods[name]._load_ptr = _vllm_shim_jit._load_ptr
    for name, m in mods.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(mods[parent], child, m)
        sys.modules[name] = m
    return True


def uninstall() -> None:
    """Remove the shim (tests use this to leave the interpreter as they found it)."""
    for name in SHIM_MODULES:
        if getattr(sys.modules.get(name), "__cpsim_shim__", False):
            del sys.modules[name]

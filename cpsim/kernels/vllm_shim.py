"""``--shim-vllm``: the vLLM names a released slot-mapping kernel file imports, so it loads
without vLLM installed. An installed vLLM is never shadowed.

Covers what the files of vLLM 0.18-0.33 (``vllm/v1/worker/block_table.py``,
``vllm/v1/worker/gpu/block_table.py``) and vllm-ascend 0.18-0.23 (``worker/v2/block_table.py``)
import at module level: Triton through ``vllm.triton_utils``, ``PAD_SLOT_ID``, ``cdiv``, ``_load_ptr``,
and stand-ins for the host classes and helpers those files define their own classes with. A stand-in
host class cannot be used: creating one (or calling a stand-in helper) raises, naming the shim.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import sys
import types

SHIM_MODULES = (
    "vllm", "vllm.triton_utils", "vllm.v1", "vllm.v1.worker", "vllm.v1.worker.gpu",
    "vllm.v1.worker.gpu.block_table", "vllm.v1.worker.gpu.buffer_utils", "vllm.v1.worker.cp_utils",
    "vllm.v1.attention", "vllm.v1.attention.backends", "vllm.v1.attention.backends.utils", "vllm.v1.utils",
    "vllm.distributed", "vllm.logger", "vllm.utils", "vllm.utils.math_utils",
    "vllm.model_executor", "vllm.model_executor.warmup", "vllm.model_executor.warmup.jit_warmup",
    "vllm.model_executor.warmup.jit_warmup_triton_helper",
)
# module -> names that stand for vLLM host classes (subclassable, not usable)
_HOST_CLASSES = {
    "vllm.v1.worker.gpu.block_table": ("BlockTables",),
    "vllm.v1.worker.gpu.buffer_utils": ("FusedStagedWriter", "StagedWriteTensor", "UvaBackedTensor"),
    "vllm.v1.utils": ("CpuGpuBuffer",),
    "vllm.model_executor.warmup.jit_warmup_triton_helper": ("TritonWarmupTensor",),
}
# module -> helper functions the files call only from host code
_HOST_FUNCTIONS = {
    "vllm.distributed": ("get_dcp_group", "get_pcp_group"),
    "vllm.v1.worker.cp_utils": ("get_total_cp_world_size",),
}


class _LauncherBase:
    """Stand-in for vLLM's ``VllmJitKernel`` / ``VllmTritonJitKernel`` launcher bases: the released v1
    file subclasses one (``ComputeSlotMappingKernel``) and instantiates it at import; cpsim only
    reads the subclass's static ``kernel``."""

    def __class_getitem__(cls, _key):
        return cls

    def register_warmup(self, **_kwargs) -> None:
        pass


def _host_class(name: str) -> type:
    def refuse(self, *args, **kwargs):
        raise RuntimeError(f"{name} is a cpsim --shim-vllm stand-in for a vLLM host class, not vLLM's class")
    return type(name, (), {"__init__": refuse, "__cpsim_shim__": True,
                           "__class_getitem__": classmethod(lambda cls, _k: cls)})


def _host_function(name: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{name} is a cpsim --shim-vllm stand-in, not vLLM's function")
    refuse.__name__ = name
    return refuse


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    mods["vllm.v1.attention.backends.utils"].PAD_SLOT_ID = -1
    mods["vllm.utils.math_utils"].cdiv = _cdiv
    mods["vllm.logger"].init_logger = logging.getLogger
    jit = mods["vllm.model_executor.warmup.jit_warmup"]
    jit.VllmJitKernel = _LauncherBase
    jit.kernel_launcher = lambda fn: fn
    helper = mods["vllm.model_executor.warmup.jit_warmup_triton_helper"]
    helper.VllmTritonJitKernel = _LauncherBase
    helper.LaunchSpec = tuple
    helper.triton_scalar_specialization_rep = lambda x: x
    for module, names in _HOST_CLASSES.items():
        for name in names:
            setattr(mods[module], name, _host_class(name))
    for module, names in _HOST_FUNCTIONS.items():
        for name in names:
            setattr(mods[module], name, _host_function(name))
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

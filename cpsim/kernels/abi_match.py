"""What a kernel object is and which calling convention (ABI) it fits: Triton or callable, its
parameters, the package and release its file is of, read into a plain ``Signature`` and matched
against the ABI table (``cpsim.kernels.abis``).
"""

from __future__ import annotations

import inspect
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cpsim.errors import ConfigError
from cpsim.kernels.abis import ABIS, RETIRED_ABIS, Abi
from cpsim.kernels.release_of import release_folder


def is_triton_kernel(obj: Any) -> bool:
    """JITFunction, the interpreter's stand-in, or an autotuner/heuristics wrapper."""
    return hasattr(obj, "arg_names") and hasattr(obj, "run") and hasattr(obj, "fn")


@dataclass(frozen=True)
class Signature:
    """What ABI detection needs of a kernel, as plain data: the worker that imported the kernel
    sends it to cpsim's process, which never imports the kernel itself."""

    name: str
    triton: bool
    is_callable: bool
    params: tuple[tuple[str, bool], ...]   # (name, has_default) in order
    origin: str = ""                       # "vllm" / "vllm_ascend" / "": the package its file is of
    obj: Any = field(default=None, compare=False)  # the kernel itself, only where it was imported
    release: str = ""                      # the release its file is of, where its folder says (release_of)

    def plain(self) -> "Signature":
        return replace(self, obj=None)


@dataclass(frozen=True)
class LoadFailure:
    """A kernel whose import (or lookup) did not complete in the worker: it raised, exited, hung or
    crashed. Every rank run of its path is a ``kernel-completes`` failure naming it."""

    kind: str      # "raised" | "exited" | "timeout" | "crashed"
    message: str   # "raised ValueError: ..." / "called sys.exit(0)" / ...


def signature_of(obj: Any) -> Signature:
    obj = unwrap(obj)
    return Signature(kernel_name(obj), is_triton_kernel(obj), callable(obj), tuple(parameters(obj)), origin(obj), obj,
                     release_of(obj))


def parameters(obj: Any) -> list[tuple[str, bool]]:
    """(name, has_default) of each parameter, in order."""
    fn = obj
    while is_triton_kernel(fn):
        fn = fn.fn
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [(p.name, p.default is not inspect.Parameter.empty) for p in sig.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def mismatch(abi: Abi, params: list[tuple[str, bool]]) -> str | None:
    """Why ``params`` do not fit ``abi``; None when they do."""
    names = {n for n, _ in params}
    known = set(abi.required) | set(abi.optional) | set(abi.one_of)
    missing = [n for n in abi.required if n not in names]
    unknown = [n for n, has_default in params if not has_default and n not in known]
    why = []
    if missing:
        why.append(f"missing {', '.join(missing)}")
    if abi.one_of and sum(n in names for n in abi.one_of) != 1:
        why.append(f"needs exactly one of {', '.join(abi.one_of)}")
    if unknown:
        why.append(f"unexpected {', '.join(unknown)}")
    if abi.name == "callable" and not params:
        why.append("takes no inputs")
    return "; ".join(why) or None


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:3] if x.isdigit())


def in_range(release: str, bounds: tuple[str, str]) -> bool:
    """Whether ``release`` (X.Y.Z) lies in ``bounds`` (first, last; inclusive); no bounds: any release."""
    return not bounds or _version_key(bounds[0]) <= _version_key(release) <= _version_key(bounds[1])


def detect_abi(obj: Any, forced: str = "auto", where: str = "kernel") -> str:
    """The ABI of a kernel object or of its ``Signature`` (what a worker reports); see ``choose_abi``."""
    sig = obj if isinstance(obj, Signature) else signature_of(obj)
    if not sig.triton and not sig.is_callable:
        raise ConfigError(where, f"{sig.name} is neither a Triton kernel nor a callable")
    return choose_abi(list(sig.params), sig.triton, sig.origin, forced, where, sig.name, sig.release)


def origin(obj: Any) -> str:
    """Which package a kernel's source file belongs to ("vllm", "vllm_ascend" or ""), from its path:
    a file of an unpacked release wheel or sdist counts as that release's."""
    fn = obj
    while is_triton_kernel(fn):
        fn = fn.fn
    file = getattr(getattr(fn, "__code__", None), "co_filename", "") or ""
    module = getattr(fn, "__module__", "") or ""
    parts = Path(file).parts
    if "vllm_ascend" in parts or module.startswith("vllm_ascend"):
        return "vllm_ascend"
    if ("vllm" in parts and "v1" in parts) or module.startswith("vllm."):
        return "vllm"
    return ""


def release_of(obj: Any) -> str:
    """The release (X.Y.Z) a kernel's file is of, where its folder says so (``release_of.release_folder``:
    a ``vllm-X.Y.Z`` or ``vllm_ascend-X.Y.Z[.postN]`` folder above its package, or a dist-info beside it).
    "" when none: names alone (or ``--kernel-abi``) decide."""
    file = source_file(obj)
    found = release_folder(Path(file)) if file else None
    version = re.fullmatch(r"(\d+\.\d+\.\d+)(\.post\d+)?", found[1]) if found else None
    return version.group(1) if version else ""


def choose_abi(params: list[tuple[str, bool]], triton: bool, source: str = "", forced: str = "auto",
               where: str = "kernel", name: str = "kernel", release: str = "") -> str:
    """Apply the ABI table to (parameter name, has default) pairs: the one ABI they fit. Parameter
    names pick the ABI; where two ABIs take the same names (vLLM 0.18-0.28's MRV2 kernel and
    cpsim's ascend-v2), the kernel's ``source`` package decides, else ``--kernel-abi`` must."""
    if forced in RETIRED_ABIS:
        raise ConfigError("--kernel-abi", RETIRED_ABIS[forced])
    if forced != "auto":
        if forced not in ABIS:
            raise ConfigError("--kernel-abi", f"unknown ABI {forced!r}; choose from auto, {', '.join(ABIS)}")
        if (forced == "callable") == triton:
            kind = "a Triton kernel" if triton else "a plain callable"
            raise ConfigError(where, f"the {forced} ABI does not fit {kind}")
        why = mismatch(ABIS[forced], params)
        if why:
            raise ConfigError(where, _signature_error(name, params, {forced: why}))
        return forced
    candidates = [a for a in ABIS.values() if (a.name == "callable") != triton]
    why = {a.name: mismatch(a, params) for a in candidates}
    fits = [n for n, w in why.items() if w is None]
    if len(fits) > 1 and source:
        fits = [n for n in fits if ABIS[n].origin == source] or fits
    if len(fits) > 1 and release:
        fits = [n for n in fits if in_range(release, ABIS[n].release_range)] or fits
    if len(fits) > 1 and all(ABIS[n].release_range for n in fits):
        fits = fits[:1]  # one signature over several release ranges, the release unknown: the first range's
    if len(fits) == 1:
        return fits[0]
    if not fits:
        raise ConfigError(where, _signature_error(name, params, why) + _triton_off_hint(params, triton))
    dtypes = ", ".join(f"{n} writes {ABIS[n].out_dtype}" for n in fits)
    raise ConfigError(where, f"{name} fits several ABIs ({dtypes}); choose one with --kernel-abi")


def _triton_off_hint(params: list[tuple[str, bool]], triton: bool) -> str:
    """A plain function whose names fit a Triton ABI: vLLM's import replaced ``@triton.jit`` by a no-op."""
    if triton:
        return ""
    fits = [a.name for a in ABIS.values() if a.name != "callable" and mismatch(a, params) is None]
    if not fits:
        return ""
    return (f"\nhint: its parameters fit the {fits[0]} Triton ABI but it arrived as a plain Python function: "
            f"vLLM turns Triton off when it sees no CUDA device (its triton_utils hands out a placeholder "
            f"@triton.jit); run with CUDA_VISIBLE_DEVICES= (set, empty) to keep real Triton, or load the "
            f"kernel file with --shim-vllm")


def kernel_name(obj: Any) -> str:
    """The kernel's own name (a Signature's, a function's or its type's), for messages."""
    if isinstance(obj, Signature):
        return obj.name
    return getattr(obj, "__name__", None) or type(obj).__name__


def _signature_error(name: str, params, why: dict[str, str]) -> str:
    lines = [f"{name}({', '.join(n for n, _ in params)}) matches no kernel ABI:"]
    closest = sorted(why, key=lambda n: len(why[n]))
    lines += [f"  {n}: {why[n]}" for n in closest]
    lines.append("expected parameters (the callable ABI takes any subset of its names):")
    lines += [f"  {ABIS[n].describe()}" for n in closest]
    return "\n".join(lines)


def unwrap(obj: Any) -> Any:
    """vLLM 0.29+ ships its v1 kernel as the static method ``kernel`` of a launcher class
    (``ComputeSlotMappingKernel``, instantiated as ``_COMPUTE_SLOT_MAPPING_KERNEL``): the class
    or its instance stands for that kernel."""
    inner = getattr(obj, "kernel", None) if not is_triton_kernel(obj) else None
    return inner if inner is not None and is_triton_kernel(inner) else obj


def source_file(obj: Any) -> str | None:
    """The real path of the file a kernel's code is in; None for a builtin or a C callable."""
    fn = obj
    while is_triton_kernel(fn):
        fn = fn.fn
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__call__", None), "__code__", None)
    return None if code is None else os.path.realpath(code.co_filename)

"""Compile one kernel for an Ascend NPU up to the first lowering stage (runs in the side venv).

triton-ascend's ``triton.compile`` runs three stages for an ``npu`` target: ``ttir``
(frontend + Triton-IR passes), ``ttadapter`` (``triton-adapter-opt``: Triton IR to
linalg / HIVM) and ``npubin`` (``bishengir-compile``, which needs the CANN toolkit).
This module takes the backend's own stage functions and stops after ``ttadapter``,
without the on-disk kernel cache (nothing is written outside a temporary folder).
"""

from __future__ import annotations

import re
import signal
import subprocess
from dataclasses import dataclass

TARGET_ARCH = "Ascend910B3"
STAGES = ("ttir", "ttadapter")


@dataclass
class Outcome:
    ok: bool
    stage: str = ""          # "frontend" | "triton-adapter-opt" when not ok
    error: str = ""          # the compiler's first error line


def first_error(e: BaseException) -> str:
    """The most specific line of a frontend or MLIR error."""
    if isinstance(e, subprocess.CalledProcessError):
        text = (e.stderr or b"").decode("utf-8", "replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        errs = [ln for ln in lines if "error:" in ln]
        if e.returncode < 0:
            try:
                sig = signal.Signals(-e.returncode).name
            except ValueError:
                sig = str(-e.returncode)
            head = next((ln for ln in lines if not ln.startswith(("#", "Stack dump", "0x"))), "")
            return f"triton-adapter-opt crashed ({sig})" + (f": {head}" if head else "")
        return (errs or lines or [f"exit status {e.returncode}"])[0]
    # Frontend: CompilationError wraps the error of the innermost call; report that one and where.
    inner, where = e, ""
    while True:
        node, src = getattr(inner, "node", None), getattr(inner, "src", None)
        if node is not None and hasattr(node, "lineno") and isinstance(src, str):
            m = re.search(r"def\s+(\w+)", src)
            where = f" (in {m.group(1) if m else 'kernel'}, line {node.lineno} of its source)"
        nxt = inner.__cause__ or (inner.__context__ if not inner.__suppress_context__ else None)
        if nxt is None:
            break
        inner = nxt
    msg = getattr(inner, "error_message", None) or str(inner)
    lines = [ln.strip() for ln in str(msg).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(inner).__name__) + where


def compile_kernel(fn, signature: dict[str, str], constants: dict, arch: str = TARGET_ARCH) -> Outcome:
    """``fn``: a triton-ascend ``JITFunction``; ``signature``: non-constexpr name -> type (``*i32``, ``i64``)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    target = GPUTarget("npu", arch, 0)
    backend = make_backend(target)
    options = backend.parse_options({})
    stages: dict = {}
    backend.add_stages(stages, options)
    missing = [s for s in STAGES if s not in stages]
    if missing:
        raise RuntimeError(f"triton-ascend's npu backend has no stage(s) {missing}: "
                           f"stages are {list(stages)}")
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    metadata = {"hash": "cpsim-ascend-check", "target": target, **options.__dict__}
    try:
        src = ASTSource(fn, signature, constants)
        module = src.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(), context)
        module = stages["ttir"](module, metadata)
    except Exception as e:  # noqa: BLE001 - any frontend failure is the result we report
        return Outcome(False, "frontend", first_error(e))
    try:
        stages["ttadapter"](module, metadata)
    except Exception as e:  # noqa: BLE001
        return Outcome(False, "triton-adapter-opt", first_error(e))
    return Outcome(True)


def is_triton_ascend() -> bool:
    """Whether the importable ``triton`` is triton-ascend (it registers the ``ascend`` backend)."""
    try:
        from triton.backends import backends
    except Exception:  # noqa: BLE001 - a broken triton is not triton-ascend
        return False
    return "ascend" in backends

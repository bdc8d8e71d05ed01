"""A user's slot-mapping kernel, loaded from a SPEC and matched to a calling convention.

SPEC is ``package.module:attr`` or ``path/to/file.py:attr`` (the file is loaded by
path, so a kernel file from a vllm-ascend checkout works without installing it),
or one of the shortcuts ``ascend`` / ``vllm`` that import the installed upstream
kernel. The ABI (which arguments the kernel takes, which grid, which output
dtype) is read off the kernel's parameter names unless forced; the adapters in
``cpsim.paths.adapters`` build exactly those arguments for one rank.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from cpsim import kernels
from cpsim.errors import ConfigError
from cpsim.kernels import vllm_shim
from cpsim.kernels.abi_match import (LoadFailure, Signature, detect_abi, kernel_name, signature_of, source_file,
                                     unwrap)
from cpsim.kernels.abi_match import parameters  # noqa: F401  (cpsim.run imports it from here)
from cpsim.kernels.abis import ABIS, REPLAY, REPLAY_ABIS  # noqa: F401  (REPLAY_ABIS: cmd.inputs imports it from here)



# Where the installed upstream kernels live: (cpsim path, shortcut) -> (package, candidates). The first
# candidate the installed release has is taken: each is a module:attr some release really ships
# (docs/UPSTREAM_ABIS.md). vllm-ascend 0.23 imports vLLM's v1 kernel under its older name for CP 1 only
# (CP > 1 goes through its torch BlockTable._compute_pcp_dcp_slot_mapping, not a kernel).
SHORTCUTS = {
    ("v1", "vllm"): ("vllm", ("vllm.v1.worker.block_table:ComputeSlotMappingKernel.kernel",      # 0.29-0.33
                              "vllm.v1.worker.block_table:_compute_slot_mapping_kernel")),       # 0.19-0.28
    ("v2", "vllm"): ("vllm", ("vllm.v1.worker.gpu.block_table:_compute_slot_mappings_kernel",)),  # 0.18-0.33
    ("v1", "ascend"): ("vllm_ascend", ("vllm_ascend.worker.block_table:_compute_slot_mapping_kernel",)),  # 0.23
    ("v2", "ascend"): ("vllm_ascend", ("vllm_ascend.worker.v2.block_table:_compute_slot_mappings_kernel",)),
    ("replay", "vllm"): ("vllm", ("vllm.models.deepseek_v41.nvidia.model_state:_pad_replayed_slots_kernel",)),
}

V2_LAUNCHES = ("split", "single")


@dataclass
class KernelUnderTest:
    """A loaded kernel and how to call it; ``notes`` collects what the adapter could not model."""

    spec: str
    obj: Any
    abi: str
    params: tuple[str, ...]
    v2_launch: str = "split"   # split: one launch per group CP size; single: one launch, as the runtime
    notes: list[str] = field(default_factory=list)
    shim_vllm: bool = False    # loaded with the vLLM shim installed
    replay: "KernelUnderTest | None" = None  # the user's replay-padding kernel run after this path's kernels
    failed: "LoadFailure | None" = None  # its import raised, exited, hung or crashed (in the worker)
    path: str = ""             # the cpsim path it was loaded for

    @property
    def builtin(self) -> bool:
        """The path's slot-mapping kernel is cpsim's own; only ``replay`` is the user's."""
        return self.spec == BUILTIN

    @property
    def load_failure(self) -> "LoadFailure | None":
        """Why this kernel or its replay kernel could not be loaded; None when both were."""
        return self.failed or (self.replay.failed if self.replay is not None else None)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def describe(self) -> str:
        parts = (["built-in slot mapping"] if self.builtin else
                 [f"{self.spec} ({'not loaded: ' + self.failed.kind if self.failed else self.abi})"])
        if self.replay is not None:
            parts.append(f"replay padding {self.replay.spec} ({self.replay.abi})")
        return " + ".join(parts)

    def record(self) -> dict[str, Any]:
        """JSON-able and picklable: what ``load_record`` loads again (in a worker, or from a repro)."""
        out = {"spec": self.spec, "abi": self.abi, "v2_launch": self.v2_launch, "shim_vllm": self.shim_vllm}
        if self.replay is not None:
            out["replay"] = {"spec": self.replay.spec, "abi": self.replay.abi, "shim_vllm": self.replay.shim_vllm}
        return out


def with_replay(k: KernelUnderTest | None, replay: KernelUnderTest | None) -> KernelUnderTest | None:
    """``k`` (or cpsim's built-in slot mapping when None) with ``replay`` as its replay-padding kernel."""
    if k is None:
        return None if replay is None else KernelUnderTest(BUILTIN, None, BUILTIN, (), replay=replay,
                                                           path=replay.path)
    k = replace(k, notes=list(k.notes), replay=replay)
    return None if k.builtin and replay is None else k


# ---- loading ---------------------------------------------------------------

def resolve(spec: str, path: str, where: str) -> Any:
    """Import the object SPEC names (a wrapper class or its instance stands for its ``kernel``)."""
    if spec in ("ascend", "vllm"):
        return _resolve_shortcut(spec, path, where)
    return unwrap(_import(spec, where))


def _resolve_shortcut(name: str, path: str, where: str) -> Any:
    shortcut = SHORTCUTS.get((path, name))
    if shortcut is None:
        have = ", ".join(f"{p}={n}" for p, n in SHORTCUTS)
        raise ConfigError(where, f"no {name!r} shortcut for the {path} path (shortcuts: {have})")
    package, candidates = shortcut
    if importlib.util.find_spec(package) is None:
        raise ConfigError(where, f"the shortcut needs {package} installed (not importable here); "
                                 f"or point at the kernel file: {where} path/to/file.py:<kernel name> "
                                 f"(add --shim-vllm if vLLM itself is not installed)")
    for spec in candidates:
        module_part, _, attr = spec.partition(":")
        module = _import_module(module_part, where)
        if _has_path(module, attr):
            return unwrap(_import(spec, where))
    raise ConfigError(where, f"the installed {package} {_version(package)} has none of "
                             f"{', '.join(candidates)} (the modules the releases cpsim read ship; "
                             f"docs/UPSTREAM_ABIS.md); point at the kernel file instead")


def _version(package: str) -> str:
    try:
        from importlib.metadata import version
        return version(package.replace("_", "-"))
    except Exception:  # noqa: BLE001 - only for a message
        return "(version unknown)"


def _has_path(obj: Any, attr: str) -> bool:
    for part in attr.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def _import_module(module_part: str, where: str):
    if module_part.endswith(".py") or "/" in module_part or "\\" in module_part:
        return _load_file(Path(module_part), where)
    try:
        return importlib.import_module(module_part)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any import failure (even sys.exit) is bad input here
        raise ConfigError(where, f"cannot import {module_part}: {type(e).__name__}: {e}{_hint(e)}") from None


def _import(spec: str, where: str) -> Any:
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise ConfigError(where, f"{spec!r} is not package.module:attr nor path/to/file.py:attr")
    if _is_file(module_part):
        module = _load_file(Path(module_part), where)
    else:
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as e:
            if e.name and (module_part + ".").startswith(e.name + ".") and not _hint(e):  # SPEC names no module: bad input
                raise ConfigError(where, f"cannot import {module_part}: no module named {e.name!r}") from None
            if _hint(e):  # vLLM not installed: a missing flag, not the kernel's failure
                raise ConfigError(where, f"cannot import {module_part}: {e}{_hint(e)}") from None
            raise KernelImportError(_import_failure(f"module {module_part}", e)) from None
        except BaseException as e:  # noqa: BLE001 - the module's own code failed (even KeyboardInterrupt): the kernel's
            raise KernelImportError(_import_failure(f"module {module_part}", e)) from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(where, f"{module_part} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _hint(e: Exception) -> str:
    name = getattr(e, "name", "") or ""
    if not isinstance(e, ImportError) or name.split(".")[0] != "vllm":
        return ""
    if vllm_shim.installed():
        return (f" (--shim-vllm is on but does not provide {name}: it stands in only for the vLLM names "
                f"released slot-mapping files import; docs/KERNEL_REFERENCE.md lists them)")
    return " (run with --shim-vllm to provide the vLLM names a released kernel file imports)"


def _load_file(file: Path, where: str):
    if not file.is_file():
        raise ConfigError(where, f"kernel file {file} does not exist")
    file = file.resolve()
    # A stable, unique name per file: triton and xdist workers resolve the module by it.
    name = f"cpsim_kernel_{file.stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001  (sys.exit, KeyboardInterrupt at import: the kernel's failure, named)
        del sys.modules[name]
        if isinstance(e, ImportError) and _hint(e):  # vLLM not installed: a missing flag, not the kernel's failure
            raise ConfigError(where, f"cannot load {file}: {type(e).__name__}: {e}{_hint(e)}") from None
        raise KernelImportError(_import_failure(f"file {file}", e)) from None
    return module


def _is_file(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part or "\\" in module_part


def _import_failure(what: str, e: BaseException) -> LoadFailure:
    if isinstance(e, SystemExit):
        return LoadFailure("exited", f"called sys.exit({e.code!r}) while its {what} was imported")
    text = str(e).splitlines()[0] if str(e) else ""
    return LoadFailure("raised", f"raised {type(e).__name__} while its {what} was imported"
                                 + (f": {text}" if text else "") + _hint(e))


class KernelImportError(Exception):
    """The user's module raised (or called sys.exit) while it was imported; ``failure`` says how."""

    def __init__(self, failure: LoadFailure):
        super().__init__(failure.message)
        self.failure = failure


def inspect_here(spec: str, path: str, shim_vllm: bool, device: str, where: str) -> Signature:
    """Import SPEC in *this* process and read its signature: in a kernel worker, or where the user
    turned isolation off. An import that raises or exits is a ``KernelImportError``; a SPEC that
    names nothing (no such module, file or attribute) is bad input (``ConfigError``)."""
    if str(device).startswith("cpu"):
        kernels.use_interpreter()  # before the kernel file imports triton
    if shim_vllm:
        vllm_shim.install()
    else:  # a long-lived worker may hold the shim from an earlier kernel that asked for it
        vllm_shim.uninstall()
    return signature_of(resolve(spec, path, where))


def check_spec(spec: str, path: str, where: str) -> None:
    """What can be told of SPEC without running any of it: its form, and that the file exists."""
    if (path, spec) in SHORTCUTS:
        return
    if spec in ("ascend", "vllm"):
        resolve(spec, path, where)  # raises: no such shortcut for this path
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise ConfigError(where, f"{spec!r} is not package.module:attr nor path/to/file.py:attr")
    if _is_file(module_part):
        file = Path(module_part)
        if not file.is_file():
            raise ConfigError(where, f"kernel file {file} does not exist")


def _inspect(spec: str, path: str, shim_vllm: bool, device: str, where: str,
             inspect: Callable | None) -> "Signature | LoadFailure":
    """How a SPEC becomes a signature is the caller's to say, every time: ``KernelRunner.probe``
    (a kernel worker imports it; the judge never does) or ``inspect_here`` (this process: the kernel
    worker itself, or isolation switched off). No default: a caller that forgot would import the
    kernel into the judge."""
    if inspect is None:
        raise RuntimeError(f"{where}: no inspector given for {spec!r} (KernelRunner.probe or inspect_here)")
    if inspect is inspect_here:
        try:
            return inspect_here(spec, path, shim_vllm, device, where)
        except KernelImportError as e:
            return e.failure
    return inspect(spec, path, shim_vllm, device, where)


def load(spec: Any, path: str | None, abi: str = "auto", *, shim_vllm: bool = False, device: str = "cpu",
         v2_launch: str = "split", where: str | None = None, inspect: Callable | None = None) -> KernelUnderTest:
    """Load a kernel for cpsim ``path``; ``spec`` may also be the kernel object itself.

    A SPEC string is imported by ``inspect`` (``KernelRunner.probe``: a kernel worker; this
    process gets the kernel's signature only). An import that raises, exits,
    hangs or crashes gives a kernel whose ``failed`` says so; its runs are ``kernel-completes``
    failures."""
    where = where or f"--kernel-{path or 'v1'}"
    if v2_launch not in V2_LAUNCHES:
        raise ConfigError("--kernel-v2-launch", f"{v2_launch!r}; choose from {', '.join(V2_LAUNCHES)}")
    if abi != "auto" and abi not in ABIS:
        raise ConfigError("--kernel-abi", f"unknown ABI {abi!r}; choose from auto, {', '.join(ABIS)}")
    if isinstance(spec, str):
        check_spec(spec, path or "v1", where)
        sig, text = _inspect(spec, path or "v1", shim_vllm, str(device), where, inspect), spec
        if isinstance(sig, LoadFailure):
            return KernelUnderTest(text, None, abi, (), v2_launch, shim_vllm=shim_vllm, failed=sig, path=path)
    else:
        sig, text = signature_of(unwrap(spec)), f"{getattr(spec, '__module__', '?')}:{kernel_name(spec)}"
    name = detect_abi(sig, abi, where)
    path = path or ABIS[name].paths[0]  # None: the first path the ABI stands in for
    if path not in ABIS[name].paths:
        fits = [a for a, d in ABIS.items() if path in d.paths]
        raise ConfigError(where, f"{text} has the {name} ABI, which cannot stand in for the {path} path "
                                 f"(it takes {', '.join(fits)})")
    return KernelUnderTest(text, sig.obj, name, tuple(n for n, _ in sig.params), v2_launch, shim_vllm=shim_vllm,
                           path=path)


def here(k: KernelUnderTest, device: str = "cpu") -> KernelUnderTest:
    """``k`` with its objects imported into this process (for in-process runs: a capture, or
    ``CPSIM_KERNEL_ISOLATION=0``); ``k`` itself when they already are."""
    if (k.builtin or k.obj is not None) and (k.replay is None or k.replay.obj is not None):
        return k
    out = load_record(k.record(), k.path or (k.replay.path if k.replay else ""), device, inspect=inspect_here)
    out.notes = k.notes
    return out


def where_raised(k: "KernelUnderTest | None", exc: BaseException) -> str:
    """The traceback of ``exc`` shortened to the user's kernel files, on one line: `` at FILE:LINE: source``
    of the innermost frame of those files, then ``; called from FILE:LINE in FUNC`` for each of their
    frames above it, innermost first (cpsim's and the libraries' frames are left out). It looks into
    the exceptions ``exc`` wraps too: the Triton interpreter's InterpreterError holds the kernel's own.
    "" when no frame is the kernel's."""
    files = {f for x in (k, getattr(k, "replay", None)) if x is not None and x.obj is not None
             for f in [source_file(x.obj)] if f}
    if not files:
        return ""
    import traceback
    found: list = []
    seen: set = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        mine = [fs for fs in traceback.extract_tb(exc.__traceback__) if os.path.realpath(fs.filename) in files]
        if mine:
            found = mine
        exc = exc.__cause__ or exc.__context__
    if not found:
        return ""
    last = found[-1]
    out = f" at {last.filename}:{last.lineno}" + (f": {last.line.strip()}" if last.line else "")
    callers = [f"{Path(fs.filename).name}:{fs.lineno} in {fs.name}" for fs in reversed(found[:-1])]
    return out + "".join(f"; called from {c}" for c in callers[:MAX_CALLERS])


MAX_CALLERS = 4  # frames of the kernel's own files named above the one that raised


# ---- records: kernels in a repro file or handed to a worker process -----------------

BUILTIN = "builtin"


def to_record(kernels: dict[str, KernelUnderTest], paths) -> dict[str, Any]:
    """``{path: "builtin" | {spec, abi, v2_launch, shim_vllm[, replay]}}`` for every path: JSON, picklable,
    reloadable. ``spec`` is "builtin" where only the replay kernel is the user's."""
    return {p: BUILTIN if p not in kernels else kernels[p].record() for p in paths}


def load_record(item: dict[str, Any], path: str, device: str = "cpu", where: str = "kernels",
                inspect: Callable | None = None) -> KernelUnderTest:
    """One path's entry of ``to_record``: its kernel (or the built-in one) and its replay kernel."""
    replay = None
    if item.get("replay"):
        r = item["replay"]
        replay = load(r["spec"], REPLAY, r.get("abi", "auto"), shim_vllm=bool(r.get("shim_vllm")), device=device,
                      where=f"{where}.replay", inspect=inspect)
    k = None
    if item["spec"] != BUILTIN:
        k = load(item["spec"], path, item.get("abi", "auto"), shim_vllm=bool(item.get("shim_vllm")),
                 device=device, v2_launch=item.get("v2_launch", "split"), where=where, inspect=inspect)
    out = with_replay(k, replay)
    if out is None:
        raise ConfigError(where, "a built-in entry with no replay kernel is written as \"builtin\"")
    return out


def from_record(record: dict[str, Any], device: str = "cpu", where: str = "kernels",
                inspect: Callable | None = None) -> dict[str, KernelUnderTest]:
    """Load what ``to_record`` wrote (a bare SPEC string is accepted too, with the ABI auto-detected)."""
    out = {}
    for path, item in (record or {}).items():
        if item in (None, BUILTIN):
            continue
        if isinstance(item, str):
            item = {"spec": item}
        if not isinstance(item, dict) or not isinstance(item.get("spec"), str):
            raise ConfigError(f"{where}.{path}", f"expected {BUILTIN!r}, a SPEC string or {{spec, abi, ...}}, "
                                                 f"got {item!r}")
        out[path] = load_record(item, path, device, f"{where}.{path}", inspect=inspect)
    return out

"""What ran on each path, as plain data for reports: cpsim's own kernel or a user's.

A report that says "all invariants hold" is worth only as much as knowing *what* held
them, so every report names, per path, the kernel under test: its SPEC, ABI, the file
it came from and a content hash of that file (so two reports of "the same kernel" can
be told apart after an edit), plus the release profile the adapters followed.

The file is found without importing anything (a kernel's module never runs in the
process that judges it): a path SPEC is read directly; a ``package.module`` SPEC is
located through the import system's finders, parent packages included, by name only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any
from cpsim.kernels.under_test import SHORTCUTS

# The release profile the adapters model (filled in once profiles exist; "cpsim" = cpsim's own).
DEFAULT_PROFILE = "cpsim"
BUILTIN = "builtin"


def _module_file(name: str) -> Path | None:
    """The source file of module ``name`` without executing it or its parent packages."""
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None):
        return Path(mod.__file__)
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    for part in parts[1:]:
        if spec is None or not spec.submodule_search_locations:
            return None
        found = None
        for d in spec.submodule_search_locations:
            for cand in (Path(d) / f"{part}.py", Path(d) / part / "__init__.py"):
                if cand.is_file():
                    found = cand
                    break
            if found:
                break
        if found is None:
            return None
        spec = importlib.util.spec_from_file_location(f"{spec.name}.{part}", found,
                                                      submodule_search_locations=[str(found.parent)]
                                                      if found.name == "__init__.py" else None)
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin != "built-in" else None


def kernel_file(spec: str, path: str = "") -> Path | None:
    """The file a SPEC's kernel lives in (shortcuts resolved), or None when it cannot be found."""
    shortcut = SHORTCUTS.get((path, spec))
    if shortcut is not None:
        spec = shortcut[1]
    module_part, sep, _ = spec.rpartition(":")
    if not sep:
        return None
    if module_part.endswith(".py") or "/" in module_part or "\\" in module_part:
        p = Path(module_part)
        return p.resolve() if p.is_file() else None
    return _module_file(module_part)


def file_hash(file: Path | None) -> str:
    """sha256 of the file's bytes (first 16 hex digits), "" when there is no file."""
    if file is None or not file.is_file():
        return ""
    return hashlib.sha256(file.read_bytes()).hexdigest()[:16]


def _one(spec: str, abi: str, path: str, extra: dict[str, Any]) -> dict[str, Any]:
    file = kernel_file(spec, path)
    return {"kind": "user", "spec": spec, "abi": abi, "file": str(file) if file else "",
            "sha256": file_hash(file), **extra}


def subject(k, path: str, profile: str = DEFAULT_PROFILE) -> dict[str, Any]:
    """One path's entry: ``{"kind": "builtin"|"user", spec, abi, file, sha256, profile[, replay]}``.

    ``k`` is a ``KernelUnderTest`` (or None: cpsim's built-in kernel)."""
    if k is None or k.builtin:
        out: dict[str, Any] = {"kind": BUILTIN, "spec": BUILTIN, "abi": "", "file": "", "sha256": "",
                               "profile": profile}
    else:
        out = _one(k.spec, k.abi, path, {"profile": profile, "v2_launch": k.v2_launch, "notes": list(k.notes)})
    replay = getattr(k, "replay", None)
    if replay is not None:
        out["replay"] = _one(replay.spec, replay.abi, "replay", {})
    return out


def subjects(kernels: dict, paths, profile: str = DEFAULT_PROFILE) -> dict[str, dict[str, Any]]:
    """``{path: subject}`` for every path in ``paths`` (built-in where ``kernels`` has none)."""
    return {p: subject(kernels.get(p), p, profile) for p in paths}


def from_record(record: dict | None, paths, profile: str = DEFAULT_PROFILE) -> dict[str, dict[str, Any]]:
    """Subjects from a ``to_record`` dict (a repro's ``kernels``), without loading any kernel."""
    out = {}
    for p in paths:
        item = (record or {}).get(p)
        if item in (None, BUILTIN):
            out[p] = subject(None, p, profile)
            continue
        if isinstance(item, str):
            item = {"spec": item}
        if item.get("spec", BUILTIN) == BUILTIN:
            out[p] = {"kind": BUILTIN, "spec": BUILTIN, "abi": "", "file": "", "sha256": "", "profile": profile}
        else:
            out[p] = _one(item["spec"], item.get("abi", "auto"), p, {"profile": profile})
        if isinstance(item.get("replay"), dict):
            out[p]["replay"] = _one(item["replay"]["spec"], item["replay"].get("abi", "auto"), "replay", {})
    return out


def distinct_notes(notes: list[str]) -> list[str]:
    """Each kind of note once. An adapter notes what it could not model per group and size, so a search over
    many scenarios collects the same note for other group names and numbers: those are one kind, printed
    as the first one seen with how many there were."""
    kinds: dict[str, list[str]] = {}
    for note in notes:
        kinds.setdefault(re.sub(r"\d+", "N", re.sub(r"\bgroup [^\s:,;]+", "group G", note)), []).append(note)
    return [same[0] + (f" ({len(same)} notes like this one, for other groups or sizes)" if len(same) > 1 else "")
            for same in kinds.values()]

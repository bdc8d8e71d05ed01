"""The stack driver: runs in the side venv's python, drives one release's host classes, sends arrays back.

``python -m cpsim.stack.driver FOLDER``: reads ``FOLDER/in.json`` + ``in.npz`` (one or more
jobs: a scenario each, arrays prefixed ``j{K}/``), writes ``FOLDER/out.json`` + ``out.npz``.
The release is imported and patched once for all jobs. A job the adapter cannot express for
the installed release is answered ``{"unsupported": {field, rule}}``; exit 3 when the release
itself cannot be loaded. Anything else (a crash, an exception from the release's code) is a
failure the parent reports; it never reads as success.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from cpsim.stack import FAMILIES
from cpsim.stack.exchange import Unsupported, read, write


def load_classes_file(path: str):
    """The user's host classes; the file's folder goes on sys.path so that it may import its siblings."""
    sys.path.insert(0, str(Path(path).parent))
    spec = importlib.util.spec_from_file_location("cpsim_stack_classes", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def job_arrays(arrays: dict, k: int) -> dict:
    pre = f"j{k}/"
    return {name[len(pre):]: a for name, a in arrays.items() if name.startswith(pre)}


def run_job(adapter, module, meta: dict, arrays: dict, out: dict, k: int) -> dict:
    meta["release_version"] = getattr(module, "version", None)  # rules that differ by release
    try:
        for path in meta["paths"]:
            adapter.check_supported(meta, path)
    except Unsupported as e:
        return {"unsupported": {"field": e.field, "rule": e.rule}}
    for path in meta["paths"]:
        for rank in range(meta["cp"]["dcp"] * meta["cp"]["pcp"]):
            tables, slots = adapter.drive(module, meta, arrays, path, rank)
            out[f"j{k}/{path}_r{rank}_slots"] = slots
            for gi, t in enumerate(tables):
                if t is not None:
                    out[f"j{k}/{path}_r{rank}_g{gi}_table"] = t
    answer = {"entry_sizes": adapter.entry_sizes(meta)}
    if hasattr(adapter, "profile"):
        answer["profile"] = adapter.profile(meta)
    return answer


def main(folder: str) -> int:
    where = Path(folder)
    top, arrays = read(where, "in")
    adapter = importlib.import_module(FAMILIES[top["family"]])
    for folder in reversed(top.get("source") or []):  # an unpacked release (sdist), not installed
        sys.path.insert(0, folder)
    try:
        classes = load_classes_file(top["classes"]) if top.get("classes") else None
        release, module = adapter.load(classes)
    except Unsupported as e:
        write(where, "out", {"unsupported": {"field": e.field, "rule": e.rule}}, {})
        return 3
    out: dict = {}
    jobs = [run_job(adapter, module, meta, job_arrays(arrays, k), out, k) for k, meta in enumerate(top["jobs"])]
    applied = adapter.patches() if hasattr(adapter, "patches") else list(adapter.PATCHES)
    write(where, "out", {"release": release, "patches": applied, "jobs": jobs}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

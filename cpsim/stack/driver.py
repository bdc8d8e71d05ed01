"""The stack driver: runs in the side venv's python, drives one release's host classes, sends arrays back.

``python -m cpsim.stack.driver FOLDER``: reads ``FOLDER/in.json`` + ``in.npz``,
writes ``FOLDER/out.json`` + ``out.npz``. Exit 0 with outputs; exit 3 with
``{"unsupported": {field, rule}}`` when the adapter cannot express the scenario
for the installed release. Anything else (a crash, an exception from the release's
code) is a failure the parent reports; it never reads as success.
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


def main(folder: str) -> int:
    where = Path(folder)
    meta, arrays = read(where, "in")
    adapter = importlib.import_module(FAMILIES[meta["family"]])
    try:
        for path in meta["paths"]:
            adapter.check_supported(meta, path)
        classes = load_classes_file(meta["classes"]) if meta.get("classes") else None
        release, module = adapter.load(classes)
        out: dict = {}
        for path in meta["paths"]:
            for rank in range(meta["cp"]["dcp"] * meta["cp"]["pcp"]):
                tables, slots = adapter.drive(module, meta, arrays, path, rank)
                out[f"{path}_r{rank}_slots"] = slots
                for gi, t in enumerate(tables):
                    if t is not None:
                        out[f"{path}_r{rank}_g{gi}_table"] = t
    except Unsupported as e:
        write(where, "out", {"unsupported": {"field": e.field, "rule": e.rule}}, {})
        return 3
    write(where, "out", {"release": release, "patches": list(adapter.PATCHES),
                         "entry_sizes": adapter.entry_sizes(meta)}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

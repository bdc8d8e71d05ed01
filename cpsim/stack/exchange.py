"""The plain data the parent and the stack driver exchange: one JSON file and one ``.npz`` each way.

Nothing here is pickled: the parent reads the child's arrays with ``allow_pickle=False``.
Numpy only (the side venv has no cpsim dependencies beyond numpy and torch).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


class Unsupported(Exception):
    """The adapter cannot express this scenario for this release: exit 2 with ``field`` and ``rule``."""

    def __init__(self, field: str, rule: str):
        super().__init__(f"{field}: {rule}")
        self.field, self.rule = field, rule


def write(folder: Path, stem: str, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    (folder / f"{stem}.json").write_text(json.dumps(meta))
    np.savez(folder / f"{stem}.npz", **arrays)


def read(folder: Path, stem: str) -> tuple[dict, dict[str, np.ndarray]]:
    meta = json.loads((folder / f"{stem}.json").read_text())
    npz = folder / f"{stem}.npz"
    if not npz.exists():
        return meta, {}
    with np.load(npz, allow_pickle=False) as z:
        return meta, {k: z[k] for k in z.files}


def request_blocks(arrays: dict[str, np.ndarray], gi: int) -> list[list[int]]:
    """Group ``gi``'s block ids per request (every CP rank is handed the same lists, as by the KV manager)."""
    flat, counts = arrays[f"blocks_g{gi}"], arrays[f"counts_g{gi}"]
    out, at = [], 0
    for n in counts.tolist():
        out.append([int(x) for x in flat[at: at + n]])
        at += n
    return out

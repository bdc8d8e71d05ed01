"""A recording stand-in for a slot-mapping kernel: what a host hands the kernel, as plain data.

Adapter conformance (:mod:`cpsim.stack.conformance`) puts a :class:`RecordingKernel` where a release's
host launches its slot-mapping kernel (``kernel[grid](...)``: the module attribute in the stack
driver child) and where cpsim's adapter launches the kernel under test, and compares the two
records argument by argument. The record is JSON (numbers, strings, lists): it crosses from the driver
child to the parent as bytes in the ``.npz`` (never pickled) and is read with ``json.loads``.

Numpy and torch only: this module runs in the side venv's driver child too.
"""

from __future__ import annotations

import ctypes
import json

import numpy as np

MAX_VALUES = 1 << 16  # tensors up to this many entries are recorded with their values
POINTER_ARGS = ("block_table_ptrs", "block_table_addrs_ptr")  # uint64 tables of int32 block-table pointers
ROWS_ARG = "idx_mapping"  # the table rows a launch reads (v1: rows 0 .. num_reqs - 1)


class RecordingKernel:
    """``kernel[grid](*args, **kwargs)`` appends one launch record to ``launches`` and computes nothing.
    ``arg_names``: the parameter names of the kernel it stands for, in order (positional arguments
    are bound to them)."""

    def __init__(self, name: str, arg_names, launches: list):
        self.name, self.arg_names, self.launches = name, tuple(arg_names), launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            named = dict(zip(self.arg_names, args))
            named.update(kwargs)
            self.launches.append(record(self.name, grid, named, self.arg_names))
        return launch


def record(kernel: str, grid, args: dict, params=()) -> dict:
    """One launch as plain data: the kernel's name and parameter names, the grid and every argument
    (:func:`describe`)."""
    grid = grid(args) if callable(grid) else grid
    rows = _rows(args)
    return {"kernel": kernel, "params": list(params), "grid": [int(x) for x in grid],
            "args": {name: describe(name, value, rows, args) for name, value in args.items()}}


def _rows(args: dict) -> list[int]:
    """The table rows the launch reads: ``idx_mapping``'s rows that are not -1 (MRV2), else 0 .. num_reqs-1."""
    idx = args.get(ROWS_ARG)
    if idx is not None and hasattr(idx, "numpy"):
        return sorted({int(r) for r in idx.detach().cpu().numpy().tolist() if r >= 0})
    qsl = args.get("query_start_loc_ptr", args.get("query_start_loc"))
    return list(range(int(qsl.numel()) - 1)) if hasattr(qsl, "numel") else []


def describe(name: str, value, rows: list[int], args: dict) -> dict:
    """An argument as plain data: ``{"type": "int" | "bool" | "float" | "none" | "other", "value"}`` or a
    tensor's ``{"type": "tensor", "dtype", "shape", "stride", "values"}`` (values of tensors up to
    MAX_VALUES entries); a pointer table's entries are followed to the tables they point at
    (:func:`_pointed`), read only at the ``rows`` the launch reads."""
    if value is None:
        return {"type": "none"}
    if isinstance(value, bool):
        return {"type": "bool", "value": value}
    if isinstance(value, (int, np.integer)):
        return {"type": "int", "value": int(value)}
    if isinstance(value, float):
        return {"type": "float", "value": value}
    if not hasattr(value, "dtype") or not hasattr(value, "shape"):
        return {"type": "other", "value": type(value).__name__}
    import torch
    host = value.detach().cpu()
    out = {"type": "tensor", "dtype": str(host.dtype).replace("torch.", ""), "shape": list(host.shape),
           "stride": list(host.stride())}
    if host.numel() <= MAX_VALUES:
        out["values"] = (host.to(torch.int64) if host.dtype == torch.uint64 else host).reshape(-1).tolist()
    if name in POINTER_ARGS:
        out["values"] = None  # addresses differ between processes; what they point at is compared
        out["tables"] = _pointed(value, args, rows)
    elif name.startswith("block_table_ptr") and host.dim() == 2:
        out["rows"] = {str(r): host[r].tolist() for r in rows if r < host.shape[0]}
        out["values"] = None
    return out


def _pointed(ptrs, args: dict, rows: list[int]) -> list[dict]:
    """The int32 tables a pointer table points at, read in place (the host's or cpsim's live tensors,
    row stride from ``block_table_strides``): each table's stride and the ``rows`` the launch reads."""
    import torch
    addresses = [int(x) for x in ptrs.detach().cpu().to(dtype=torch.int64).tolist()]
    strides = args.get("block_table_strides", args.get("block_table_strides_ptr"))
    strides = strides.detach().cpu().tolist() if strides is not None else [0] * len(addresses)
    out = []
    for address, stride in zip(addresses, strides):
        table = {"stride": int(stride), "rows": {}}
        for r in rows:
            cells = (ctypes.c_int32 * int(stride)).from_address(address + 4 * r * int(stride))
            table["rows"][str(r)] = np.ctypeslib.as_array(cells).astype(np.int64).tolist()
        out.append(table)
    return out


def to_bytes(launches: list[dict]) -> np.ndarray:
    """Launch records as a uint8 array (the ``.npz`` the driver child writes holds arrays only)."""
    return np.frombuffer(json.dumps(launches).encode(), dtype=np.uint8).copy()


def from_bytes(data: np.ndarray) -> list[dict]:
    """What :func:`to_bytes` wrote (plain JSON; nothing executed)."""
    got = json.loads(bytes(np.asarray(data, dtype=np.uint8)).decode())
    if not isinstance(got, list):
        raise ValueError("a launch record is a JSON list")
    return got

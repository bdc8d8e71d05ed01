"""Capture from the host block-table classes: a runtime's own ``compute_slot_mapping(s)``, wrapped.

The kernel-launch recorder sees what a kernel was handed; this wraps the host object that
launches it (vLLM's v1 ``MultiGroupBlockTable.compute_slot_mapping``, MRV2
``BlockTables.compute_slot_mappings``, vllm-ascend's v1 ``MultiGroupBlockTable``), so what is
recorded is the object's own state after the call: per group the table rows and each row's
live block count (``num_blocks_per_row`` / ``num_blocks``: an id 0 below it is block 0), the
slot buffer it filled, its CP world, rank and interleave, block and kernel block sizes, buffer
sizes. The call itself runs unchanged; reading happens after it returns, and a reading failure
stops recording, never the serving process.

Records go into the same ``rank<R>.cpcap`` files (family ``host-v1`` / ``host-v2``), and
``cpsim replay`` turns each step into an explicit step (:func:`to_step`), judged like any other.
Attribute names are the releases' (vLLM 0.33.0 ``vllm/v1/worker/block_table.py`` and
``gpu/block_table.py``; vllm-ascend 0.18.0 / 0.23.0.post1 ``vllm_ascend/worker/block_table.py``).
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

import numpy as np

FAMILIES = ("host-v1", "host-v2")  # the targets are cpsim.capture.KNOWN_HOSTS (module:Class.method)


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy().copy()
    return np.array(x, copy=True)


def _half(buffer: Any, on_host: bool) -> Any:
    """The half of a CpuGpuBuffer the call used: the host half when the release computed on the host
    (vllm-ascend's CPU / numpy branches), else the device half (vLLM's kernel, vllm-ascend on NPU)."""
    return buffer.cpu if on_host else buffer.gpu


def _v1_group(bt: Any, num_reqs: int, on_host: bool) -> tuple[dict, dict]:
    mode = getattr(getattr(bt, "slot_mapping_mode", None), "value", None)
    mamba = bool(getattr(bt, "is_mamba_group", False)) or mode == "none"
    entry = int(bt.block_size)
    physical = int(getattr(bt, "physical_block_size", entry))
    dcp, pcp = int(getattr(bt, "dcp_world_size", 1)), int(getattr(bt, "pcp_world_size", 1))
    info = {"kind": "mamba" if mamba else "attention", "block_size": physical, "entry_size": entry,
            "cp_world": dcp * pcp, "cp_rank": int(getattr(bt, "pcp_rank", 0)) * dcp + int(getattr(bt, "dcp_rank", 0)),
            "interleave": int(getattr(bt, "cp_kv_cache_interleave_size", 1)),
            "max_num_reqs": int(bt.max_num_reqs), "max_num_batched_tokens": int(bt.max_num_batched_tokens)}
    arrays = {"table": _np(_half(bt.block_table, on_host)[:num_reqs]),
              "num_blocks": np.asarray(bt.num_blocks_per_row[:num_reqs], dtype=np.int64).copy(),
              "slots": _np(_half(bt.slot_mapping, on_host)).astype(np.int64)}
    return info, arrays


def _bound(fn, obj, args, kwargs) -> dict[str, Any]:
    b = inspect.signature(fn).bind(obj, *args, **kwargs)
    return dict(b.arguments)


def read_v1(obj: Any, fn, args, kwargs) -> tuple[dict, dict] | str:
    """(host meta, arrays) of one MultiGroupBlockTable call, or why it is not recorded."""
    a = _bound(fn, obj, args, kwargs)
    if a.get("positions_compressed_list") and a.get("req_indices_compressed_list"):
        return "compressed-group slot mapping (positions_compressed_list) is not recorded"
    positions = _np(a["positions"]).astype(np.int64)
    if "num_reqs" in a:                       # vLLM, vllm-ascend 0.23: (num_reqs, query_start_loc, positions)
        num_reqs = int(a["num_reqs"])
        qsl = _np(a["query_start_loc"]).astype(np.int64)[: num_reqs + 1]
        on_host = type(obj).__module__.startswith("vllm_ascend") and getattr(a["positions"], "device", None) is not None \
            and a["positions"].device.type == "cpu"
    else:                                     # vllm-ascend 0.18: (req_indices, positions) numpy
        req = np.asarray(a["req_indices"], dtype=np.int64)
        if req.size and (np.diff(req) < 0).any():
            return "req_indices are not grouped by request (not np.repeat of arange)"
        num_reqs = int(req.max()) + 1 if req.size else 0
        qsl = np.concatenate([[0], np.cumsum(np.bincount(req, minlength=num_reqs))]).astype(np.int64)
        on_host = True
    groups, arrays = [], {"positions": positions, "query_start_loc": qsl}
    for gi, bt in enumerate(obj.block_tables):
        info, arr = _v1_group(bt, num_reqs, on_host)
        groups.append(info)
        arrays |= {f"g{gi}/{k}": v for k, v in arr.items()}
    return {"groups": groups, "num_tokens_padded": int(qsl[-1]) if len(qsl) else 0}, arrays


def read_v2(obj: Any, fn, args, kwargs) -> tuple[dict, dict] | str:
    """(host meta, arrays) of one MRV2 BlockTables.compute_slot_mappings call."""
    a = _bound(fn, obj, args, kwargs)
    if a.get("out") is not None:
        return "compute_slot_mappings(out=...) wrote another buffer than the object's"
    idx = _np(a["idx_mapping"]).astype(np.int64)
    rows = int(idx.max()) + 1 if idx.size else 0
    enabled = list(getattr(obj, "_slot_mapping_enabled", [True] * obj.num_kv_cache_groups))
    sharded = _np(obj.dcp_sharded).astype(bool).tolist() if hasattr(obj, "dcp_sharded") \
        else [True] * obj.num_kv_cache_groups
    kernel = list(getattr(obj, "kernel_block_sizes", obj.block_sizes))
    live = _np(obj.num_blocks.cpu if hasattr(obj.num_blocks, "cpu") else obj.num_blocks) \
        if hasattr(obj, "num_blocks") else None
    groups, arrays = [], {"positions": _np(a["positions"]).astype(np.int64),
                          "query_start_loc": _np(a["query_start_loc"]).astype(np.int64)[: len(idx) + 1],
                          "idx_mapping": idx}
    slots = _np(obj.slot_mappings).astype(np.int64)
    for gi in range(obj.num_kv_cache_groups):
        world = int(obj.cp_size) if sharded[gi] else 1
        groups.append({"kind": "attention" if enabled[gi] else "mamba", "block_size": int(obj.block_sizes[gi]),
                       "entry_size": int(kernel[gi]), "cp_world": int(obj.cp_size),
                       "cp_rank": int(obj.cp_rank), "interleave": int(obj.cp_interleave), "sharded": world > 1,
                       "max_num_reqs": int(obj.max_num_reqs),
                       "max_num_batched_tokens": int(obj.max_num_batched_tokens)})
        arrays[f"g{gi}/table"] = _np(obj.block_tables[gi].gpu[:rows])
        arrays[f"g{gi}/slots"] = slots[gi]
        if live is not None:
            arrays[f"g{gi}/num_blocks"] = live[gi, :rows].astype(np.int64)
    return {"groups": groups, "num_tokens_padded": int(a["num_tokens_padded"])}, arrays


READERS = {"compute_slot_mapping": ("host-v1", read_v1), "compute_slot_mappings": ("host-v2", read_v2)}


def wrap_method(cls: type, method: str, recorder, name: str):
    """Replace ``cls.method`` by a wrapper that calls it, then records the object's state."""
    fn = cls.__dict__[method]
    if getattr(fn, "_cpsim_host", False):
        return fn
    family, reader = READERS[method]

    @functools.wraps(fn)
    def recorded(self, *args, **kwargs):
        result = fn(self, *args, **kwargs)
        _record(recorder, name, family, reader, fn, self, args, kwargs)
        return result
    recorded._cpsim_host = True
    setattr(cls, method, recorded)
    return fn


def _record(rec, name, family, reader, fn, obj, args, kwargs) -> None:
    if rec.failed:
        return
    try:
        got = reader(obj, fn, args, kwargs)
        if isinstance(got, str):
            return
        host, arrays = got
        cp_rank = host["groups"][0]["cp_rank"] if host["groups"] else 0
        rank = rec.rank(fallback=cp_rank)
        step, call = rec._place(rank, ("host", id(obj)))
        rec.launches += 1
        if rec.policy.wants(step, rank):
            meta = {"kernel": name, "family": family, "host": host, "step": step, "call": call, "rank": rank}
            rec.write(rank, step, call, meta, arrays)
    except Exception as e:  # noqa: BLE001 - recording must never take the serving process down
        rec.failed = f"{type(e).__name__}: {e}"
        print(f"cpsim.capture: recording stopped at a {name} call: {rec.failed}", file=sys.stderr)

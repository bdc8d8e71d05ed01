"""Adapter for vllm-ascend's v1 host block table (``vllm_ascend/worker/block_table.py``).

Read from vllm-ascend's ``MultiGroupBlockTable`` / ``BlockTable`` (the constructor
arithmetic of the 0.23 line: ``max_num_blocks`` defaults to ``cdiv(max_model_len, B x DCP)``
for every group, a mamba group's width is multiplied back by DCP, the slot buffer holds
``max_num_batched_tokens + max(num_speculative_tokens - 1, 0) x max_num_reqs`` entries
(the MTP draft reserve), tables hold kernel-block ids when ``kernel_sizes`` splits a block,
and under DCP > 1 slots are computed by the torch function ``_compute_dcp_slot_mapping``
with the physical block size in the virtual block). It is called as the release's NPU
runner calls it: ``compute_slot_mapping(num_reqs, query_start_loc, positions[:num_scheduled])``.

What this adapter does NOT do yet: drive the installed vllm-ascend package itself. Its
``block_table`` module imports ``vllm_ascend.distributed.utils`` and
``vllm_ascend.ops.triton.compute_slot_mapping``, whose package ``__init__`` imports
``torch_npu`` (NPU only); :func:`load` says so (exit 2). It drives host classes of your
own in that shape (``--stack-classes FILE``), which is how cpsim's tests express the three
host bugs upstream shipped (mamba width divided by CP, slot buffer without the draft
reserve, kernel block size where the KV block size belongs).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from cpsim.stack.exchange import Unsupported, request_blocks

RELEASES = ("0.23.0.post1",)
PATCHES = (
    "get_dcp_group in the host classes' module answered per rank (world_size DCP, rank_in_group = the CP "
    "rank being built): the virtual world has no process groups",
    "pin_memory=False and device cpu passed to the constructor (the NPU runner passes its NPU device)",
)


def check_supported(meta: dict, path: str) -> None:
    if path != "v1":
        raise Unsupported("--paths", "the vllm-ascend adapter drives the v1 MultiGroupBlockTable only; "
                                     "vllm_ascend/worker/v2/block_table.py is not driven yet (use --paths v1)")
    cp, world = meta["cp"], meta["cp"]["dcp"] * meta["cp"]["pcp"]
    if cp["pcp"] != 1:
        raise Unsupported("--pcp", "the host class read computes DCP slots only (dcp_world_size); PCP is the "
                                   "runner's, not driven here")
    for g in meta["groups"]:
        where = f"groups.{g['name']}"
        if g["kind"] == "sliding_window":
            raise Unsupported(f"{where}.kind", "cpsim's ring-buffer sliding window has no counterpart in "
                                               "vllm-ascend's v1 block table")
        if g["kind"] == "attention" and g["world"] != world:
            raise Unsupported(f"{where}.cp_size", "vllm-ascend's v1 BlockTable applies one DCP size to every "
                                                  "attention group")
    if meta["has_padding_flags"] or meta["has_replay"]:
        raise Unsupported("batch", "vllm-ascend's v1 block table takes no padding flags or replay window")


def entry_sizes(meta: dict) -> list[int]:
    """Kernel-block ids where the kernel block splits the block (hybrid blocks), physical ids otherwise."""
    return [g["block_size"] if g["kind"] == "mamba" else g["kernel_block_size"] for g in meta["groups"]]


class _Group:
    def __init__(self, world_size: int, rank_in_group: int):
        self.world_size, self.rank_in_group = world_size, rank_in_group


def load(classes):
    if classes is None:
        try:
            import vllm_ascend.worker.block_table as module  # noqa: F401
        except Exception as e:  # any import failure of the release is the reason, not a crash
            raise Unsupported("--stack", f"vllm-ascend's block_table does not import on this host "
                                         f"({type(e).__name__}: {e}); its package imports torch_npu (NPU only). "
                                         f"Drive host classes of your own in its shape with --stack-classes") from None
        import vllm_ascend
        return f"vllm-ascend {getattr(vllm_ascend, '__version__', '?')}", module
    for name in ("MultiGroupBlockTable", "MambaSpec", "AttentionSpec"):
        if not hasattr(classes, name):
            raise Unsupported("--stack-classes", f"the file defines no {name} (the vllm-ascend shape needs "
                                                 f"MultiGroupBlockTable, MambaSpec, AttentionSpec)")
    return f"own classes in the vllm-ascend shape ({getattr(classes, 'NAME', classes.__file__)})", classes


def drive(mod, meta: dict, arrays: dict, path: str, rank: int):
    import sys
    import torch
    # The name is looked up in the module that defines the classes (the release imports it there).
    home = sys.modules[mod.MultiGroupBlockTable.__module__]
    home.get_dcp_group = lambda: _Group(meta["cp"]["dcp"], rank)
    lim, groups = meta["limits"], meta["groups"]
    specs = [SimpleNamespace(kv_cache_spec=mod.MambaSpec() if g["kind"] == "mamba" else mod.AttentionSpec())
             for g in groups]
    kernel_sizes = [[g["kernel_block_size"]] if g["kernel_block_size"] != g["block_size"] else [0] for g in groups]
    table = mod.MultiGroupBlockTable(
        lim["max_num_reqs"], lim["max_model_len"], lim["max_num_batched_tokens"], False, torch.device("cpu"),
        [g["block_size"] for g in groups], num_speculative_tokens=lim["num_speculative_tokens"],
        kernel_sizes=kernel_sizes, cp_kv_cache_interleave_size=meta["cp"]["interleave"], kv_cache_groups=specs)
    blocks = [request_blocks(arrays, gi) for gi in range(len(groups))]
    num_reqs = len(arrays["query_start_loc"]) - 1
    for i in range(num_reqs):
        table.add_row(tuple(b[i] for b in blocks), i)
    table.commit_block_table(num_reqs)
    qsl = torch.from_numpy(arrays["query_start_loc"].astype(np.int32))
    pos = torch.from_numpy(arrays["positions"].astype(np.int64))
    table.compute_slot_mapping(num_reqs, qsl, pos[: int(qsl[-1])])
    tables = [bt.block_table.cpu.numpy().copy() for bt in table.block_tables]
    # One buffer length for all groups: the shortest of the slot-mapped groups' (what a short
    # buffer cannot hold is then capacity's to judge, never hidden behind another group's length).
    mapped = [bt for bt, g in zip(table.block_tables, groups) if g["kind"] != "mamba"] or table.block_tables
    entries = min(bt.slot_mapping.cpu.numel() for bt in mapped)
    slots = np.full((len(groups), entries), -1, dtype=np.int64)
    for gi, bt in enumerate(table.block_tables):
        s = bt.slot_mapping.cpu.numpy()[:entries]
        slots[gi, : s.size] = s
    return tables, slots

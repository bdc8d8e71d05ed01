"""Adapter for vLLM's host block tables, read from vLLM 0.23.0, 0.26.0, 0.28.0, 0.31.0, 0.33.0 and 0.34.0 (what
differs is each release's ``rules`` in cpsim/releases/vllm.json; 0.34.0 has no v1 runner, its v1 is not in the release).

Read from (vLLM 0.33.0 wheel; the same files of the others): ``vllm/v1/worker/block_table.py`` (``MultiGroupBlockTable``,
``BlockTable``, ``get_block_table_width``), ``vllm/v1/worker/gpu/block_table.py``
(``BlockTables``, the MRV2 host class), ``vllm/v1/kv_cache_interface.py`` (each spec's
``max_num_blocks_per_req``, ``uses_slot_mapping``, ``dcp_sharded``,
``block_table_token_alignment``) and the two runners that call them
(``gpu_model_runner.py`` ``may_reinitialize_input_batch``; ``gpu/model_runner.py``, the
``BlockTables(...)`` call): widths are the spec's ``max_num_blocks_per_req`` (v1: then
``get_block_table_width`` in the constructor; MRV2: the runner applies it), the slot buffer is
``max_num_batched_tokens``, v1 passes ``positions[:num_scheduled]``, MRV2 passes the padded count.

Translation of cpsim groups (anything else is exit 2, see :func:`check_supported`):
attention sharded over the whole CP world -> ``FullAttentionSpec(dcp_sharded=True)``; attention
replicated (``cp_sharded`` false or ``cp_size`` 1) -> ``dcp_sharded=False`` (MRV2 only: v1 has one
DCP size for every group); mamba -> ``MambaSpec`` in the ``align`` cache mode (position-indexed
rows, cpsim's model of a state table), v1 ``SlotMappingMode.NONE``. Block ids: each request gets
``cdiv(allocated_len, B x g)`` blocks, the same list on every rank (the scheduler's KV manager
hands one list to all DCP ranks), drawn without 0 (vLLM's null block).
"""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from cpsim import releases
from cpsim.stack.exchange import Unsupported, request_blocks

# What differs between the releases read is the table's (cpsim/releases/vllm.json, each release's "rules"):
# kernel_blocks: the constructors take kernel_block_sizes and the tables hold kernel-block ids
#   (BlockTable.map_to_kernel_blocks; 0.28, 0.31), else physical ids (0.33, 0.34);
# v2_flags: BlockTables takes slot_mapping_enabled and dcp_sharded (0.31 on; 0.28 has neither);
# v2_widths: how gpu/model_runner.py sizes the MRV2 tables: "spec" = the spec's
#   max_num_blocks_per_req then get_block_table_width(token_alignment=spec's) (0.31 on);
#   "runner-0.28" = cdiv(max_len, B x DCP) for every group, a mamba group's then
#   (+ num_speculative_blocks, no alignment) (0.28).
# v1_call: "0.28" = MultiGroupBlockTable(..., max_num_blocks = the spec's max_num_blocks_per_req,
#   slot_mapping_modes) (0.26-0.33); "0.23" = (max_model_len, ..., kernel_block_sizes, max_num_blocks = the
#   runner's cdiv(max_model_len, B x CP), a mamba group's + num_speculative_blocks; no slot_mapping_modes:
#   every group is slot-mapped; the constructor rounds widths up to 128 // B entries)
#   (gpu_model_runner.py may_reinitialize_input_batch, 0.23.0); null: no v1 runner (0.34);
# "runner-0.23" MRV2 widths: cdiv(max_len, B x DCP) rounded up to 128 // B entries (B <= 128), a mamba
#   group's then + num_speculative_blocks (gpu/model_runner.py initialize_kv_cache, 0.23.0 and 0.26.0).
# dummy_rows: the MRV2 kernel skips a request whose idx_mapping is -1 (is_real_req, gpu/block_table.py
#   _compute_slot_mappings_kernel, 0.31 on), so a dummy row with tokens can be handed to it; before 0.31
#   the kernel reads every request's row.
# Each path's profile, host class and the module of get_block_table_width (vllm.v1.worker.block_table to
# 0.33, vllm.v1.kv_cache_interface in 0.34) are the table's too. A release the table does not list is
# driven by the rules of the nearest listed one (cpsim.releases.standing).
PROJECT = "vllm"
SHAPE_BEFORE_LOAD = "0.33.0"  # whose rules apply before the installed release is known (check_supported before load)
GROUPS_PATCH = ("get_dcp_group / get_pcp_group in vllm.v1.worker.block_table answered per rank (world_size DCP, "
                "rank_in_group = the CP rank being built; PCP 1/0): the virtual world has no process groups "
                "(under torchrun vLLM's own groups answer: cpsim.stack.runtime_groups)")
PATCHES = (
    "CUDA_VISIBLE_DEVICES='' and TRITON_INTERPRET=1 before vLLM is imported: with no CUDA device vLLM's "
    "triton_utils would hand out a placeholder (kernels as plain functions); an empty list keeps real Triton, "
    "whose interpreter then runs the released kernels on CPU tensors",
    "PIN_MEMORY = False in vllm.utils.torch_utils and vllm.v1.utils: pinning needs a CUDA driver",
    "vllm.v1.worker.gpu.buffer_utils.UvaBuffer backed by a plain CPU tensor (its .uva() is that tensor; in "
    "0.28 .uva is an attribute, so the stand-in follows the release's form) and "
    "is_uva_available answered True there: UVA views need a CUDA device; the MRV2 tables' staged writes go "
    "through them",
    GROUPS_PATCH,
)

H2D_PATCH = ("vllm.v1.worker.gpu.buffer_utils.async_tensor_h2d called with pin_memory=False (0.18 passes "
             "pin_memory=True at its call; 0.23's default was bound to PIN_MEMORY when vllm.utils.torch_utils "
             "was imported, before the patch above; 0.28+ take no pin_memory and are left alone): "
             "StagedWriteTensor.apply_write stages every table write through it")
CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}


_applied: list[str] = []


NO_V1 = "no v1 block table in this release (0.34.0 on): get_dcp_group / get_pcp_group not answered, nothing to patch"


def patches(runtime_groups: bool = False) -> list[str]:
    """What was patched in this child (the driver reports it): PATCHES, and what only some releases need;
    under torchrun (``runtime_groups``) the groups are vLLM's own and not answered, and a release without
    a v1 block table has none to answer them in."""
    skip = runtime_groups or NO_V1 in _applied
    return [p for p in PATCHES if not (skip and p == GROUPS_PATCH)] + [p for p in _applied if p != NO_V1]


def check_supported(meta: dict, path: str) -> None:
    """Raise :class:`Unsupported` for what the installed release's host classes cannot be handed."""
    cp, v = meta["cp"], f"vLLM {meta.get('release_version') or '0.33.0'}"
    if cp["pcp"] != 1:
        raise Unsupported("--pcp", f"{v} shards KV over DCP only (block_table.py uses dcp_world_size); "
                                   f"PCP {cp['pcp']} has no counterpart")
    world = cp["dcp"] * cp["pcp"]
    for g in meta["groups"]:
        where = f"groups.{g['name']}"
        if g["kind"] == "sliding_window":
            raise Unsupported(f"{where}.kind", f"cpsim's ring-buffer sliding window has no {v} counterpart "
                                               f"(CircularBufferSpec takes no slot mapping)")
        if g["kind"] == "attention" and 1 < g["world"] < world:
            raise Unsupported(f"{where}.cp_size", f"{v} shards a group over all of DCP or replicates it "
                                                  f"(dcp_sharded, 0.31 on); CP size {g['world']} of {world} is neither")
        if (path == "v1" or not _rules(meta)["v2_flags"]) and g["kind"] == "attention" and g["world"] == 1 \
                and world > 1:
            raise Unsupported(f"{where}.cp_sharded", f"{v}'s {'v1 BlockTable' if path == 'v1' else 'MRV2 BlockTables'} "
                                                     "applies one DCP size to every group; a replicated attention "
                                                     "group exists on MRV2 from 0.31 on (dcp_sharded)")
    budget = meta["limits"]["max_num_batched_tokens"]
    scheduled = meta["num_tokens"] if path == "v1" else meta["num_tokens_padded"]
    if scheduled > budget:
        # The release's buffers hold max_num_batched_tokens entries; its kernels write every scheduled
        # (v1) or padded (MRV2) token there, so a larger batch writes past them (on a CPU: heap corruption).
        raise Unsupported("limits.max_num_batched_tokens",
                          f"vLLM's scheduler schedules at most max_num_batched_tokens tokens, drafts included "
                          f"(vllm/v1/core/sched/scheduler.py: token_budget); this batch hands {path} {scheduled} "
                          f"tokens{' (padded)' if path == 'v2' else ''} > {budget}")
    if meta["has_padding_flags"]:
        raise Unsupported("batch.is_padding", f"{v}'s block tables take no per-token padding flags")
    if meta.get("dummy_tokens") and path == "v1":
        raise Unsupported("batch.idx_mapping", f"{v}'s v1 BlockTable has a row per request: a dummy request "
                                               "(idx_mapping -1) is MRV2's")
    if meta.get("dummy_tokens") and not _rules(meta).get("dummy_rows"):
        raise Unsupported("batch.idx_mapping", f"{v}'s MRV2 kernel reads the table row of every request it is "
                                               "handed (no idx_mapping -1 guard; is_real_req arrives in 0.31.0)")
    if meta["has_replay"]:
        raise Unsupported("batch.replay_start", f"{v}'s block tables take no prefix-replay window")


def _release(meta: dict) -> releases.Release:
    """The listed release whose contract drives the installed one (the driver puts its version into
    ``meta``: the installed release's, or the nearest listed one's; before load: SHAPE_BEFORE_LOAD's)."""
    return releases.release(PROJECT, meta.get("release_version") or SHAPE_BEFORE_LOAD)


def _rules(meta: dict) -> dict:
    return _release(meta).rules


def profile(meta: dict) -> str:
    """The release profile the installed release is judged by (of MRV2 when only that path runs, else
    of the first path the release has)."""
    rel = _release(meta)
    paths = [p for p in (meta.get("paths") or releases.PATHS) if not rel.path(p).absent]
    return path_profile(meta, paths[0] if paths else "v2")


def path_profile(meta: dict, path: str) -> str:
    """The profile of one path's host classes: 0.23's v1 and MRV2 fall in different profile ranges."""
    c = _release(meta).path(path)
    return c.host_profile or c.profile


def absent(mod, path: str) -> str:
    """Why ``path`` is not in the installed release ("" when it is): the table's word, or the standing's."""
    return mod.absent.get(path, "")


def entry_sizes(meta: dict) -> list[int]:
    """Physical ids (0.33: one entry is B slots) or kernel-block ids (0.28, 0.31: b slots)."""
    kernel = _rules(meta)["kernel_blocks"]
    return [g["kernel_block_size"] if kernel and g["kind"] != "mamba" else g["block_size"] for g in meta["groups"]]


def _kernel_sizes(meta: dict) -> list[int]:
    return [g["block_size"] if g["kind"] == "mamba" else g["kernel_block_size"] for g in meta["groups"]]


class _Group:
    def __init__(self, world_size: int, rank_in_group: int):
        self.world_size, self.rank_in_group = world_size, rank_in_group


class _CpuUvaBuffer:
    """UvaBuffer's interface over a plain CPU tensor (no UVA on a CPU host)."""

    def __init__(self, size, dtype):
        import torch
        self.cpu = torch.zeros(size, dtype=dtype, device="cpu")
        self.np = self.cpu.numpy()

    def uva(self, n=None):
        return self.cpu[:n] if n is not None else self.cpu


class _CpuUvaBufferAttr:
    """0.28's UvaBuffer: ``.uva`` is the view itself (an attribute, not a method)."""

    def __init__(self, size, dtype):
        import torch
        self.cpu = torch.zeros(size, dtype=dtype, device="cpu")
        self.np = self.cpu.numpy()
        self.uva = self.cpu


def patch_mrv2_buffers() -> list[str]:
    """PIN_MEMORY off and MRV2's UvaBuffer over a CPU tensor (PATCHES 2 and 3); shared with the vllm-ascend
    adapter, whose AscendBlockTables stages writes through the same buffers."""
    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.utils as v1_utils
    torch_utils.PIN_MEMORY = False
    v1_utils.PIN_MEMORY = False
    from vllm.v1.worker.gpu import buffer_utils
    method = callable(getattr(buffer_utils.UvaBuffer, "uva", None))
    buffer_utils.UvaBuffer = _CpuUvaBuffer if method else _CpuUvaBufferAttr
    buffer_utils.is_uva_available = lambda: True
    applied = list(PATCHES[1:3])
    h2d = getattr(buffer_utils, "async_tensor_h2d", None)
    if h2d is not None and "pin_memory" in inspect.signature(h2d).parameters:  # 0.18, 0.23; 0.28+ take none
        def unpinned(*args, **kwargs):
            kwargs["pin_memory"] = False
            return h2d(*args, **kwargs)
        buffer_utils.async_tensor_h2d = unpinned
        applied.append(H2D_PATCH)
    return applied


def load(classes):
    """Patch the installed vLLM for CPU and return (release, namespace of its host classes)."""
    os.environ.update(CPU_ENV)
    if classes is not None:
        raise Unsupported("--stack-classes", "the vllm adapter drives the installed release only")
    try:
        import vllm
    except ImportError as e:
        raise Unsupported("--stack-python", f"vLLM is not importable there ({e})") from None
    root = Path(vllm.__file__).resolve().parents[1]
    st = releases.standing(PROJECT, vllm.__version__, root, need_rules=True)
    rel = releases.release(PROJECT, st.contract)
    files = releases.project(PROJECT).path_files
    gone = {p: rel.path(p).absent or f"vLLM {vllm.__version__} has no {', '.join(files[p])}" for p in st.absent_paths}
    if "v1" in gone:
        _applied.append(NO_V1)
    try:
        _applied.extend(patch_mrv2_buffers()[2:])
        from vllm.v1 import kv_cache_interface as kvi
        hosts = {p: None if p in gone else importlib.import_module(rel.path(p).host_module) for p in releases.PATHS}
        width = None
        if rel.width:
            module, _, name = rel.width.partition(":")
            width = getattr(importlib.import_module(module), name)
    except Exception as e:  # noqa: BLE001 - any import failure of the release is the reason, not a crash
        raise Unsupported("--stack", f"vLLM {vllm.__version__}'s host classes do not import here "
                                     f"({type(e).__name__}: {e})") from None
    return f"vllm {vllm.__version__}", SimpleNamespace(
        v1=hosts["v1"], v2=hosts["v2"], kvi=kvi, width=width, version=st.contract, absent=gone,
        installed={"project": PROJECT, "version": vllm.__version__, "root": str(root)})


def _specs(mod, meta: dict):
    import torch
    kvi = mod.kvi
    out = []
    for g in meta["groups"]:
        if g["kind"] == "mamba":
            out.append(kvi.MambaSpec(block_size=g["block_size"], shapes=((1,),), dtypes=(torch.float32,),
                                     mamba_cache_mode="align",
                                     num_speculative_blocks=meta["limits"]["num_speculative_tokens"]))
        else:
            # dcp_sharded is a spec field from 0.31 on; 0.28's specs are all sharded over DCP.
            fields = getattr(kvi.FullAttentionSpec, "__dataclass_fields__", {})
            extra = {"dcp_sharded": g["world"] > 1} if "dcp_sharded" in fields else {}
            out.append(kvi.FullAttentionSpec(block_size=g["block_size"], num_kv_heads=1, head_size=1,
                                             dtype=torch.float16, **extra))
    return out


def _config(meta: dict):
    return SimpleNamespace(parallel_config=SimpleNamespace(decode_context_parallel_size=meta["cp"]["dcp"]),
                           cache_config=SimpleNamespace(mamba_cache_mode="align", enable_prefix_caching=True))


def drive(mod, meta: dict, arrays: dict, path: str, rank: int):
    """One rank: build the release's host object, fill it, compute slots; (tables, slots [G, entries])."""
    meta["release_version"] = mod.version
    if not meta.get("runtime_groups") and mod.v1 is not None:  # under torchrun vLLM's own groups answer
        mod.v1.get_dcp_group = lambda: _Group(meta["cp"]["dcp"], rank)
        mod.v1.get_pcp_group = lambda: _Group(1, 0)
    return (_drive_v1 if path == "v1" else _drive_v2)(mod, meta, arrays, rank)


def _v2_width(mod, rules, spec, cfg, mml: int, dcp: int) -> int:
    """The MRV2 runner's table width of the release (gpu/model_runner.py, the loop before BlockTables)."""
    if rules["v2_widths"] == "runner-0.23":
        return _runner_023_width(spec.block_size, mml, dcp, isinstance(spec, mod.kvi.MambaSpec),
                                 spec.num_speculative_blocks if isinstance(spec, mod.kvi.MambaSpec) else 0)
    width = mod.width
    if rules["v2_widths"] == "spec":
        return width(spec.max_num_blocks_per_req(cfg, mml), spec.block_size,
                     token_alignment=spec.block_table_token_alignment)
    n = -(-mml // (spec.block_size * dcp))
    if isinstance(spec, mod.kvi.MambaSpec):
        return width(n + spec.num_speculative_blocks, spec.block_size, token_alignment=None)
    return width(n, spec.block_size)


def _runner_023_width(block_size: int, mml: int, dcp: int, mamba: bool, spec_blocks: int) -> int:
    """0.23.0 MRV2 runner: cdiv(max_len, B x DCP), rounded up to a multiple of 128 // B when B <= 128 (TRTLLM),
    then a mamba group's (that, prefix caching on) + num_speculative_blocks."""
    n = -(-mml // (block_size * dcp))
    if block_size <= 128:
        step = 128 // block_size
        n = -(-n // step) * step
    return n + spec_blocks if mamba else n


def _v1_widths_023(meta: dict) -> list[int]:
    """0.23.0 v1 runner (may_reinitialize_input_batch): cdiv(max_model_len, B x CP), a mamba group's + spec
    blocks (prefix caching on); the constructor then applies its own 128 // B rounding."""
    mml, world, spec = meta["limits"]["max_model_len"], meta["cp"]["dcp"], meta["limits"]["num_speculative_tokens"]
    return [-(-mml // (g["block_size"] * world)) + (spec if g["kind"] == "mamba" else 0) for g in meta["groups"]]


def _batch(meta, arrays):
    import torch
    qsl = torch.from_numpy(arrays["query_start_loc"].astype(np.int32))
    pos = torch.from_numpy(arrays["positions"].astype(np.int64))
    return qsl, pos


def _drive_v1(mod, meta, arrays, rank):
    import torch
    lim, specs, cfg = meta["limits"], _specs(mod, meta), _config(meta)
    mml = lim["max_model_len"]
    if _rules(meta)["v1_call"] == "0.23":
        call = {"max_model_len": mml, "max_num_blocks": _v1_widths_023(meta)}
    else:
        call = {"max_num_blocks": [sp.max_num_blocks_per_req(cfg, mml) for sp in specs], "slot_mapping_modes": [
            mod.v1.SlotMappingMode.NONE if g["kind"] == "mamba" else mod.v1.SlotMappingMode.TOKEN_TO_KV_SLOT
            for g in meta["groups"]]}
    table = mod.v1.MultiGroupBlockTable(
        max_num_reqs=lim["max_num_reqs"], max_num_batched_tokens=lim["max_num_batched_tokens"], pin_memory=False,
        device=torch.device("cpu"), block_sizes=[g["block_size"] for g in meta["groups"]],
        cp_kv_cache_interleave_size=meta["cp"]["interleave"], **call,
        **({"kernel_block_sizes": _kernel_sizes(meta)} if _rules(meta)["kernel_blocks"] else {}))
    blocks = [request_blocks(arrays, gi) for gi in range(len(meta["groups"]))]
    num_reqs = len(arrays["query_start_loc"]) - 1
    for i in range(num_reqs):
        table.add_row(tuple(b[i] for b in blocks), i)
    table.commit_block_table(num_reqs)
    qsl, pos = _batch(meta, arrays)
    table.compute_slot_mapping(num_reqs, qsl, pos[: int(qsl[-1])])
    tables = [bt.block_table.gpu.numpy().copy() for bt in table.block_tables]
    slots = np.stack([bt.slot_mapping.gpu.numpy().astype(np.int64) for bt in table.block_tables])
    return tables, slots


def _drive_v2(mod, meta, arrays, rank):
    import torch
    lim, specs, cfg = meta["limits"], _specs(mod, meta), _config(meta)
    mml = lim["max_model_len"]
    rules = _rules(meta)
    widths = [_v2_width(mod, rules, sp, cfg, mml, meta["cp"]["dcp"]) for sp in specs]
    extra = {}
    if rules["v2_flags"]:
        extra.update(slot_mapping_enabled=[sp.uses_slot_mapping for sp in specs],
                     dcp_sharded=[sp.dcp_sharded for sp in specs])
    if rules["kernel_blocks"]:
        extra.update(kernel_block_sizes=_kernel_sizes(meta))
    tables = mod.v2.BlockTables(
        block_sizes=[sp.block_size for sp in specs], max_num_reqs=lim["max_num_reqs"],
        max_num_batched_tokens=lim["max_num_batched_tokens"], max_num_blocks_per_group=widths,
        device=torch.device("cpu"), cp_size=meta["cp"]["dcp"], cp_rank=rank, cp_interleave=meta["cp"]["interleave"],
        **extra)
    blocks = [request_blocks(arrays, gi) for gi in range(len(meta["groups"]))]
    rows = arrays["rows"].tolist()
    for i, row in enumerate(rows):
        if row >= 0:
            tables.append_block_ids(row, tuple(b[i] for b in blocks), overwrite=True)
    tables.apply_staged_writes()
    qsl, pos = _batch(meta, arrays)
    n_pad = meta["num_tokens_padded"]
    idx = torch.from_numpy(arrays["rows"].astype(np.int32))
    tables.compute_slot_mappings(idx, qsl, pos[:n_pad], n_pad)
    return ([t.gpu.numpy().copy() for t in tables.block_tables],
            tables.slot_mappings.numpy().astype(np.int64).copy())


def kernel_sites(mod, path: str) -> list[tuple[object, str]]:
    """Where the release's host looks its slot-mapping kernel up at launch time (adapter conformance puts
    a recorder there): v1 ``_compute_slot_mapping_kernel`` (0.19-0.28) or ``ComputeSlotMappingKernel.kernel``
    (0.29+, launched through ``_COMPUTE_SLOT_MAPPING_KERNEL``'s ``self.kernel``); MRV2
    ``_compute_slot_mappings_kernel`` (vllm/v1/worker/gpu/block_table.py)."""
    if path == "v2":
        return [(mod.v2, "_compute_slot_mappings_kernel")]
    if hasattr(mod.v1, "ComputeSlotMappingKernel"):
        return [(mod.v1.ComputeSlotMappingKernel, "kernel")]
    return [(mod.v1, "_compute_slot_mapping_kernel")]

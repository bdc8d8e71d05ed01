"""Adapter for vllm-ascend's host block tables, read from the vllm-ascend 0.13.0, 0.18.0 and 0.23.0.post1
sdists: v1 ``vllm_ascend/worker/block_table.py`` (all three) and MRV2 ``vllm_ascend/worker/v2/block_table.py``
``AscendBlockTables`` (0.18.0, 0.23.0.post1; built and called as the paired vLLM's MRV2 runner builds
vLLM's ``BlockTables``, which vllm-ascend's patch replaces with it: :func:`_drive_v2`).

The installed (or unpacked: ``--stack-source DIR``, the sdist's top folder) release is driven on a
CPU, one ``MultiGroupBlockTable`` per CP rank, called as that release's NPU runner calls it
(``vllm_ascend/worker/model_runner_v1.py``):

- **0.23.0.post1** (built for vLLM 0.23.0): ``compute_slot_mapping(num_reqs, query_start_loc,
  positions[:num_scheduled])`` with torch tensors; under CP > 1 the table's torch function
  ``_compute_pcp_dcp_slot_mapping`` computes the slots (virtual block = the physical block x CP),
  mamba groups are skipped. The runner sizes each group ``cdiv(max_model_len, B x CP)`` (a mamba
  group's ``max(that, that or 1) + num_speculative_blocks``) and the table multiplies a mamba
  group's width back by CP (``kv_cache_group``); the slot buffer holds ``max_num_batched_tokens
  + 2 x PCP x max_num_reqs + max(num_speculative_tokens - 1, 0) x max_num_reqs``.
- **0.18.0** (built for vLLM 0.18.0): ``compute_slot_mapping(req_indices, positions)`` with numpy
  arrays, then ``commit_slot_mapping``; the CP branch is numpy with the virtual block = the
  table's (kernel) block x CP, every group is mapped (mamba too), widths are the runner's
  ``cdiv(max_model_len, B x CP)`` (mamba: ``max(that, (that or 1) + num_speculative_blocks)``,
  not multiplied back: vllm-ascend #9724), the buffer has no draft reserve (#14024).
- **0.13.0** (built for vLLM 0.13.0): the 0.18.0 call and CP branch, but the constructor takes no
  ``max_num_blocks``: it sizes every group ``max(cdiv(max_model_len, B x DCP x PCP), 1 + spec)`` itself
  (``kv_cache_groups`` is passed, as the runner does, and unused by the tables).

Translation of cpsim groups: attention sharded over the whole CP world -> vLLM's
``FullAttentionSpec`` in a ``KVCacheGroupSpec``; mamba -> ``MambaSpec`` (``align`` mode, prefix
caching on: position-indexed rows, cpsim's model of a state table); kernel sizes as the runner
builds them (``[kernel block]`` for attention, ``[0]`` for mamba). Block ids: each request gets
``cdiv(allocated_len, B x CP)`` blocks, the same list on every rank, never 0 (the null block).
Anything else is exit 2 (:func:`check_supported`). Judged with the ``vllm-ascend-0.23`` profile
(cpsim/check/profiles.py, read from 0.18.0-0.23.0.post1).

Host classes of your own in the 0.23 shape (``--stack-classes FILE``) are driven the same way;
that is how cpsim's tests express the three host bugs upstream shipped and fixed (tests/stack_hosts).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from cpsim import releases
from cpsim.stack import vllm as vllm_adapter
from cpsim.stack.vllm import _runner_023_width
from cpsim.stack.exchange import Unsupported, request_blocks

# What differs between the releases read is the table's (cpsim/releases/vllm-ascend.json, each release's "rules"):
# call: "torch" = compute_slot_mapping(num_reqs, query_start_loc, positions) (0.23.0.post1),
#       "numpy" = compute_slot_mapping(req_indices, positions) + commit_slot_mapping (0.18.0);
# groups_arg: the constructor takes kv_cache_groups (0.23.0.post1; it multiplies a mamba width by CP);
# widths_arg: the runner hands the constructor max_num_blocks (0.18.0 on); 0.13.0's constructor sizes
#   every group max(cdiv(max_model_len, B x DCP x PCP), 1 + num_speculative_tokens) itself;
# v2: the MRV2 host class (vllm_ascend/worker/v2/block_table.py AscendBlockTables, which
#   vllm_ascend/patch/worker/patch_v2/patch_block_table.py puts in place of vLLM's BlockTables, so vLLM's
#   own gpu/model_runner.py constructs it): "0.18" = vLLM 0.18's call (max_model_len; every table
#   cdiv(max_model_len, B x CP) wide, physical ids, no kernel block sizes), "0.23" = vLLM 0.23's
#   (max_num_blocks_per_group from the runner, kernel_block_sizes), None = no such file (0.13.0).
# The table also holds each release's "built_for" (the vLLM release the runner checks for: vllm_version_is in
# that sdist) and each path's profile. A release it does not list is driven by the nearest listed one's rules.
PROJECT = "vllm-ascend"
OWN_SHAPE = "0.23.0.post1"  # host classes of your own are driven in this release's shape

CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1", "VLLM_PLUGINS": ""}
GROUPS_PATCH = ("get_dcp_group / get_pcp_group / get_total_cp_world_size in vllm_ascend.worker.block_table "
                "answered per rank (DCP world size and the rank being built; PCP 1/0): the virtual world has no "
                "process groups (under torchrun the paired vLLM's own groups answer: cpsim.stack.runtime_groups)")
PATCHES_ALWAYS = (
    "CUDA_VISIBLE_DEVICES='' and TRITON_INTERPRET=1 before vLLM is imported (as for the vllm adapter: vLLM's "
    "triton_utils then keeps real Triton); VLLM_PLUGINS='' so that an installed vllm-ascend's platform plugin "
    "(NPUPlatform, which imports torch_npu) is not loaded by vLLM's platform detection",
    GROUPS_PATCH,
    "pin_memory=False and device cpu passed to the constructor (the NPU runner passes its NPU device)",
)
PIN_PATCH = ("torch.Tensor.pin_memory a no-op returning the tensor: 0.23.0.post1's "
             "BlockTable.commit_block_table calls .clone().pin_memory() unconditionally, which needs an "
             "accelerator driver (applied for every release; 0.13.0 / 0.18.0 pass pin_memory=False on)")
NO_TORCH_NPU = ("no torch_npu stub: the imports of vllm_ascend.worker.block_table and "
                "vllm_ascend.worker.v2.block_table (the package __init__s of vllm_ascend, vllm_ascend.worker and "
                "vllm_ascend.worker.v2 included) touch vLLM only in 0.13.0, 0.18.0 and 0.23.0.post1")
_applied: list[str] = []


def patches(runtime_groups: bool = False) -> list[str]:
    """What was patched in this child (the driver reports it); under torchrun (``runtime_groups``) the
    groups are the paired vLLM's own (or the classes file's) and not answered."""
    return [p for p in PATCHES_ALWAYS if not (runtime_groups and p == GROUPS_PATCH)] + _applied


def _release(meta: dict) -> releases.Release:
    return releases.release(PROJECT, meta.get("release_version") or OWN_SHAPE)


def _rules(meta: dict) -> dict:
    return _release(meta).rules


def absent(mod, path: str) -> str:
    """Why ``path`` is not in the loaded release ("" when it is; host classes of your own: never)."""
    return getattr(mod, "absent", {}).get(path, "")


def check_supported(meta: dict, path: str) -> None:
    """Raise :class:`Unsupported` for what vllm-ascend's host tables cannot be handed."""
    if path == "v2":
        _check_v2(meta)
    cp, world = meta["cp"], meta["cp"]["dcp"] * meta["cp"]["pcp"]
    if cp["pcp"] != 1:
        raise Unsupported("--pcp", "the runner splits positions over PCP before the table (pcp_manager); "
                                   "only DCP is driven here")
    for g in meta["groups"]:
        where = f"groups.{g['name']}"
        if g["kind"] == "sliding_window":
            raise Unsupported(f"{where}.kind", "cpsim's ring-buffer sliding window has no counterpart in "
                                               "vllm-ascend's v1 block table")
        if g["kind"] == "attention" and g["world"] != world:
            raise Unsupported(f"{where}.cp_size", f"vllm-ascend's {'v1 BlockTable' if path == 'v1' else 'AscendBlockTables'} "
                                                  "applies one CP size to every attention group")
    if meta["has_padding_flags"] or meta["has_replay"] or meta.get("dummy_tokens"):
        raise Unsupported("batch", "vllm-ascend's host tables take no padding flags, dummy rows with tokens or "
                                     "replay window")


def _check_v2(meta: dict) -> None:
    version = meta.get("release_version")
    if version is None:
        raise Unsupported("--paths", "host classes of your own are driven on v1 only (the 0.23.0.post1 "
                                     "MultiGroupBlockTable shape); use --paths v1")
    if _rules(meta)["v2"] is None:
        raise Unsupported("--paths", f"vllm-ascend {version} has no vllm_ascend/worker/v2/block_table.py "
                                     f"(no MRV2 host class); use --paths v1")
    if _rules(meta)["v2"] == "0.18" and any(g["kind"] == "mamba" for g in meta["groups"]):
        raise Unsupported("groups.kind", "vLLM 0.18.0's MRV2 runner (gpu/model_runner.py initialize_kv_cache), "
                                         "which builds vllm-ascend 0.18.0's AscendBlockTables, has no mamba "
                                         "(state) groups")
    budget, padded = meta["limits"]["max_num_batched_tokens"], meta["num_tokens_padded"]
    if padded > budget:
        # AscendBlockTables' slot buffer holds max_num_batched_tokens entries; its kernel writes every
        # padded token there, so a larger batch writes past it (the scheduler never hands one).
        raise Unsupported("limits.max_num_batched_tokens",
                          f"vLLM's scheduler schedules at most max_num_batched_tokens tokens, drafts included "
                          f"(vllm/v1/core/sched/scheduler.py: token_budget); this batch hands v2 {padded} "
                          f"tokens (padded) > {budget}")


def entry_sizes(meta: dict) -> list[int]:
    """Kernel-block ids where the kernel block splits the block (hybrid blocks), physical ids otherwise."""
    return [g["block_size"] if g["kind"] == "mamba" else g["kernel_block_size"] for g in meta["groups"]]


def path_entry_sizes(meta: dict, path: str) -> list[int]:
    """0.18.0's MRV2 table (vLLM 0.18's BlockTables) holds physical ids; every other table kernel-block ids."""
    if path == "v2" and _rules(meta)["v2"] == "0.18":
        return [g["block_size"] for g in meta["groups"]]
    return entry_sizes(meta)


def profile(meta: dict) -> str:
    return path_profile(meta, "v2") if meta.get("paths") == ["v2"] else path_profile(meta, "v1")


def path_profile(meta: dict, path: str) -> str:
    """v1: vllm-ascend's own runner's contract. MRV2: vLLM's, whose gpu/model_runner.py sizes and calls
    AscendBlockTables (vllm_ascend/worker/v2/model_runner.py NPUModelRunner.initialize_kv_cache is
    super()'s; the subclass changes only the slot kernel and an int32 buffer): vLLM 0.18-0.28's MRV2 profile."""
    c = _release(meta).path(path if path == "v2" or not _release(meta).path(path).absent else "v2")
    return c.host_profile or c.profile


class _Group:
    def __init__(self, world_size: int, rank_in_group: int):
        self.world_size, self.rank_in_group = world_size, rank_in_group


def _release_version() -> str:
    try:
        from vllm_ascend._version import __version__
    except Exception:  # noqa: BLE001 - any failure of the release's own file is the reason below
        import importlib.metadata as md
        try:
            return md.version("vllm_ascend")
        except md.PackageNotFoundError:
            raise Unsupported("--stack-source", "vllm_ascend is not importable in the side venv (install it, or "
                                                "pass the unpacked sdist folder with --stack-source)") from None
    return str(__version__)


def _missing_vllm_names(version: str) -> None:
    """A release run against a vLLM it was not built for (``--stack-source`` of another vLLM): stand-ins for
    the two vLLM names 0.18.0 / 0.23.0.post1 import that 0.28+ dropped; beside the vLLM each was built for
    (make upstream-check) both exist and nothing is stood in.

    ``_compute_slot_mapping_kernel`` (vllm.v1.worker.block_table, gone in 0.31) is used only when the
    CP world is 1; its stand-in raises. ``get_total_cp_world_size`` (vllm.v1.worker.cp_utils, absent
    in 0.28 and 0.33) is answered per rank by :func:`drive` anyway. 0.13.0 imports neither."""
    if version == "0.13.0":
        return
    import vllm.v1.worker.block_table as vbt
    import vllm.v1.worker.cp_utils as cpu
    if version == "0.23.0.post1" and not hasattr(vbt, "_compute_slot_mapping_kernel"):
        vbt._compute_slot_mapping_kernel = _KernelAbsent()
        _applied.append("vllm.v1.worker.block_table._compute_slot_mapping_kernel stubbed (raises if launched): "
                        "removed in the installed vLLM, imported by 0.23.0.post1, launched only at CP world 1")
    if not hasattr(cpu, "get_total_cp_world_size"):
        cpu.get_total_cp_world_size = lambda: 1
        _applied.append("vllm.v1.worker.cp_utils.get_total_cp_world_size stubbed (answered per rank later): "
                        f"absent in the installed vLLM, imported by {version}")


class _KernelAbsent:
    """Stands in for a Triton kernel the installed vLLM does not have: any launch raises."""

    def __getitem__(self, grid):
        raise RuntimeError("vLLM's _compute_slot_mapping_kernel is absent in the installed vLLM; vllm-ascend "
                           "launches it at CP world 1 only (not driven)")


def load(classes):
    """Patch for CPU and return (release, namespace of the host classes)."""
    os.environ.update(CPU_ENV)
    if classes is not None:
        for name in ("MultiGroupBlockTable", "MambaSpec", "AttentionSpec"):
            if not hasattr(classes, name):
                raise Unsupported("--stack-classes", f"the file defines no {name} (the vllm-ascend shape needs "
                                                     f"MultiGroupBlockTable, MambaSpec, AttentionSpec)")
        name = getattr(classes, "NAME", classes.__file__)
        return (f"own classes in the vllm-ascend {OWN_SHAPE} shape ({name})",
                SimpleNamespace(own=True, version=None, bt=classes, kvi=None))
    installed = _release_version()
    root = _package_root()
    st = releases.standing(PROJECT, installed, root, need_rules=True)
    version = st.contract  # the listed release whose rules drive it
    gone = {p: releases.release(PROJECT, version).path(p).absent or f"vllm-ascend {installed} has no "
            f"{', '.join(releases.project(PROJECT).path_files[p])}" for p in st.absent_paths}
    try:
        import vllm
        _missing_vllm_names(version)
        import torch
        torch.Tensor.pin_memory = lambda self, *a, **k: self
        _applied.append(PIN_PATCH)
        _applied.append(NO_TORCH_NPU)
        import vllm_ascend.worker.block_table as bt
        from vllm.v1 import kv_cache_interface as kvi
        v2 = None if "v2" in gone else _load_v2(version)
    except Exception as e:  # noqa: BLE001 - any import failure of the release is the reason, not a crash
        raise Unsupported("--stack", f"vllm-ascend {installed}'s block_table does not import here "
                                     f"({type(e).__name__}: {e})") from None
    built_for = releases.release(PROJECT, version).built_for
    if vllm.__version__ != built_for:
        _applied.append(f"run against vLLM {vllm.__version__}; vllm-ascend {version} was built for vLLM {built_for}")
    return (f"vllm-ascend {installed} (vLLM {vllm.__version__})",
            SimpleNamespace(own=False, version=version, bt=bt, kvi=kvi, v2=v2, absent=gone,
                            installed={"project": PROJECT, "version": installed, "root": str(root) if root else None}))


def _package_root() -> Path | None:
    """The folder holding the vllm_ascend package (the sdist's top folder, or site-packages)."""
    import importlib.util
    spec = importlib.util.find_spec("vllm_ascend")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


def _load_v2(version: str):
    """The release's AscendBlockTables module, vLLM's MRV2 buffers patched for CPU first (as the vllm
    adapter does; the subclass stages its table writes through them). None where the release has none."""
    if releases.release(PROJECT, version).rules["v2"] is None:
        return None
    _applied.extend(vllm_adapter.patch_mrv2_buffers())
    import vllm_ascend.worker.v2.block_table as v2
    return v2


def _answer_groups(home, dcp: int, rank: int) -> None:
    home.get_dcp_group = lambda: _Group(dcp, rank)
    home.get_pcp_group = lambda: _Group(1, 0)
    home.get_total_cp_world_size = lambda: dcp


def _runner_widths(meta: dict) -> list[int]:
    """``max_num_blocks`` as the release's runner computes it (model_runner_v1.py, before NPUInputBatch):
    ``n = cdiv(max_model_len, B x CP)``; a mamba group's ``max(n, n) + spec blocks`` (0.23.0.post1) or
    ``max(n, n + spec blocks)`` (0.18.0), both ``n + spec blocks`` with prefix caching on (cpsim's model)."""
    mml, world = meta["limits"]["max_model_len"], meta["cp"]["dcp"]
    spec_blocks = meta["limits"]["num_speculative_tokens"]
    out = []
    for g in meta["groups"]:
        n = -(-mml // (g["block_size"] * world))
        if g["kind"] == "mamba":
            n += spec_blocks
        out.append(n)
    return out


def _groups(mod, meta: dict):
    """KVCacheGroupSpecs of the release's vLLM (own classes: their AttentionSpec / MambaSpec)."""
    if mod.own:
        return [SimpleNamespace(kv_cache_spec=mod.bt.MambaSpec() if g["kind"] == "mamba" else mod.bt.AttentionSpec())
                for g in meta["groups"]]
    import torch
    kvi, out = mod.kvi, []
    for g in meta["groups"]:
        if g["kind"] == "mamba":
            # mamba_cache_mode is a spec field from vLLM 0.18 on (0.13's MambaSpec has none)
            mode = {"mamba_cache_mode": "align"} if "mamba_cache_mode" in kvi.MambaSpec.__dataclass_fields__ else {}
            spec = kvi.MambaSpec(block_size=g["block_size"], shapes=((1,),), dtypes=(torch.float32,),
                                 num_speculative_blocks=meta["limits"]["num_speculative_tokens"], **mode)
        else:
            spec = kvi.FullAttentionSpec(block_size=g["block_size"], num_kv_heads=1, head_size=1, dtype=torch.float16)
        out.append(kvi.KVCacheGroupSpec(layer_names=[g["name"]], kv_cache_spec=spec))
    return out


def drive(mod, meta: dict, arrays: dict, path: str, rank: int):
    """One rank: build the release's host object, fill it, compute slots; (tables, slots [G, entries])."""
    meta["release_version"] = mod.version
    if path == "v2":
        return _drive_v2(mod, meta, arrays, rank)
    return _drive_v1(mod, meta, arrays, rank)


def _drive_v1(mod, meta: dict, arrays: dict, rank: int):
    import torch
    rules = _rules(meta)
    if not meta.get("runtime_groups"):  # under torchrun the table asks the runtime's own groups
        _answer_groups(sys.modules[mod.bt.MultiGroupBlockTable.__module__], meta["cp"]["dcp"], rank)
    lim, groups = meta["limits"], meta["groups"]
    kernel_sizes = [[0] if g["kind"] == "mamba" else [g["kernel_block_size"]] for g in groups]
    extra = {"kv_cache_groups": _groups(mod, meta)} if rules["groups_arg"] else {}
    if rules["widths_arg"]:
        extra["max_num_blocks"] = _runner_widths(meta)
    table = mod.bt.MultiGroupBlockTable(
        max_num_reqs=lim["max_num_reqs"], max_model_len=lim["max_model_len"],
        max_num_batched_tokens=lim["max_num_batched_tokens"], pin_memory=False, device=torch.device("cpu"),
        block_sizes=[g["block_size"] for g in groups], num_speculative_tokens=lim["num_speculative_tokens"],
        kernel_sizes=kernel_sizes,
        cp_kv_cache_interleave_size=meta["cp"]["interleave"], **extra)
    blocks = [request_blocks(arrays, gi) for gi in range(len(groups))]
    qsl_np = arrays["query_start_loc"].astype(np.int64)
    num_reqs = len(qsl_np) - 1
    for i in range(num_reqs):
        table.add_row(tuple(b[i] for b in blocks), i)
    table.commit_block_table(num_reqs)
    n = int(qsl_np[-1])
    pos_np = arrays["positions"].astype(np.int64)[:n]
    if rules["call"] == "torch":
        table.compute_slot_mapping(num_reqs, torch.from_numpy(qsl_np.astype(np.int32)), torch.from_numpy(pos_np))
    else:
        req_indices = np.repeat(np.arange(num_reqs, dtype=np.int64), np.diff(qsl_np))
        table.compute_slot_mapping(req_indices, pos_np)
        table.commit_slot_mapping(n)
    # What the runner does next (model_runner_v1.py, building attention metadata at PCP 1, both releases):
    # ``slot_mapping[num_tokens:num_tokens_padded].fill_(-1)`` for every group's buffer. On a CPU the
    # release's own CPU branch runs (0.23.0.post1 ``_compute_pcp_dcp_slot_mapping`` reads and writes the
    # ``.cpu`` halves when its inputs are CPU tensors; the NPU runner's device tensors take the ``.gpu``
    # branch, same arithmetic), so the ``.cpu`` halves are what was computed and what is read back.
    for bt in table.block_tables:
        bt.slot_mapping.cpu[n: meta["num_tokens_padded"]].fill_(-1)
    return _read_back(table, groups)


def _read_back(table, groups):
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


def _drive_v2(mod, meta: dict, arrays: dict, rank: int):
    """AscendBlockTables as the paired vLLM's MRV2 runner builds and calls BlockTables (gpu/model_runner.py:
    one per DCP rank, ``cp_size`` DCP; ``append_block_ids`` per request, ``apply_staged_writes``, then
    ``compute_slot_mappings(idx_mapping, query_start_loc, positions, num_tokens_padded)``)."""
    import torch
    lim, groups, cp = meta["limits"], meta["groups"], meta["cp"]
    common = dict(block_sizes=[g["block_size"] for g in groups], max_num_reqs=lim["max_num_reqs"],
                  max_num_batched_tokens=lim["max_num_batched_tokens"], device=torch.device("cpu"),
                  cp_size=cp["dcp"], cp_rank=rank, cp_interleave=cp["interleave"])
    if _rules(meta)["v2"] == "0.18":
        tables = mod.v2.AscendBlockTables(max_model_len=lim["max_model_len"], **common)
    else:
        widths = [_runner_023_width(g["block_size"], lim["max_model_len"], cp["dcp"], g["kind"] == "mamba",
                                    lim["num_speculative_tokens"]) for g in groups]
        kernel = [g["block_size"] if g["kind"] == "mamba" else g["kernel_block_size"] for g in groups]
        tables = mod.v2.AscendBlockTables(max_num_blocks_per_group=widths, kernel_block_sizes=kernel, **common)
    blocks = [request_blocks(arrays, gi) for gi in range(len(groups))]
    for i, row in enumerate(arrays["rows"].tolist()):
        if row >= 0:
            tables.append_block_ids(row, tuple(b[i] for b in blocks), overwrite=True)
    tables.apply_staged_writes()
    n_pad = meta["num_tokens_padded"]
    qsl = torch.from_numpy(arrays["query_start_loc"].astype(np.int32))
    pos = torch.from_numpy(arrays["positions"].astype(np.int64))
    tables.compute_slot_mappings(torch.from_numpy(arrays["rows"].astype(np.int32)), qsl, pos[:n_pad], n_pad)
    return ([t.gpu.numpy().copy() for t in tables.block_tables],
            tables.slot_mappings.numpy().astype(np.int64).copy())


def kernel_sites(mod, path: str) -> list[tuple[object, str]]:
    """Where the release's host looks its slot-mapping kernel up at launch time (adapter conformance puts
    a recorder there): MRV2 ``_compute_slot_mappings_kernel`` of vllm_ascend/worker/v2/block_table.py; v1
    (0.23.0.post1) vLLM's ``_compute_slot_mapping_kernel`` as vllm_ascend/worker/block_table.py imports it,
    launched at CP world 1 only (a larger world maps slots in torch: no launch to record)."""
    if path == "v2":
        return [(mod.v2, "_compute_slot_mappings_kernel")]
    kernel = getattr(mod.bt, "_compute_slot_mapping_kernel", None)
    return [(mod.bt, "_compute_slot_mapping_kernel")] if hasattr(kernel, "arg_names") else []

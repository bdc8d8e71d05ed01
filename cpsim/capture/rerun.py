"""Run a kernel on an explicit step's inputs: cpsim's own ("builtin") or a user's (``--kernel-v1/-v2 SPEC``).

The kernel gets the captured tables, positions, ``query_start_loc`` and
``idx_mapping`` as they were, through its own ABI; outputs are poisoned first
and handed back as int64 ``[groups, entries]`` per rank, for the coordinator.
A user's kernel is imported and called only in a kernel worker (``run``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cpsim import kernels
from cpsim.capture import rerun_released
from cpsim.capture.batch import ExplicitStep, RankBatch
from cpsim.errors import ConfigError
from cpsim.kernels.under_test import KernelUnderTest, parameters
from cpsim.layout import PAD_SLOT_ID, POISON
from cpsim.paths import _intact

TILE = 1024


def _t(a: np.ndarray, dtype, device) -> torch.Tensor:
    return torch.as_tensor(np.ascontiguousarray(a)).to(device=device, dtype=dtype)


def _builtin(path: str):
    from cpsim.paths._inputs import prepare_triton
    prepare_triton(torch.device("cpu"))
    if path == "v1":
        from cpsim.kernels.triton_v1 import _compute_slot_mapping_kernel as k
    else:
        from cpsim.kernels.triton_v2 import _compute_slot_mappings_kernel as k
    return KernelUnderTest("builtin", k, "builtin", tuple(n for n, _ in parameters(k)))


def _v1_rank(k, step: ExplicitStep, r: int, rb: RankBatch, T: int, device, written) -> np.ndarray:
    out = np.full((len(step.groups), T), PAD_SLOT_ID, dtype=np.int64)
    qsl = _t(np.minimum(rb.query_start_loc, T), torch.int32, device)
    pos = _t(rb.positions, torch.int64, device)
    for gi, (g, e, table) in enumerate(zip(step.groups, step.entry_sizes, rb.tables)):
        if table is None:
            continue
        n = g.world(step.cp)
        tab = _t(table, torch.int32, device)
        buf = torch.full((T,), POISON, dtype=torch.int64 if k.abi == "builtin" else torch.int32, device=device)
        args = dict(num_tokens=min(rb.num_tokens_padded, T), max_num_tokens=T, query_start_loc_ptr=qsl,
                    positions_ptr=pos, block_table_ptr=tab, block_table_stride=tab.stride(0), block_size=e,
                    slot_mapping_ptr=buf, KV_CACHE_BLOCK_SIZE=g.block_size, BLOCKS_PER_KV_BLOCK=g.block_size // e,
                    TOTAL_CP_WORLD_SIZE=n, TOTAL_CP_RANK=r if n > 1 else 0,
                    CP_KV_CACHE_INTERLEAVE_SIZE=step.cp.interleave, PAD_ID=PAD_SLOT_ID, TILE_BLOCK_SIZE=TILE,
                    BLOCK_TABLE_WINDOW_SIZE=kernels.window_size(TILE, e), IS_CIRCULAR=g.circular)
        if g.circular and "IS_CIRCULAR" not in k.params:
            raise ConfigError("kernel", f"{k.spec} has no IS_CIRCULAR flag; group {g.name} is a sliding-window ring")
        with _intact.bracket(written, [(gi, "positions", pos), (gi, "query_start_loc", qsl), (gi, "block table", tab)]):
            k.obj[(rb.num_reqs + 1,)](**{n_: v for n_, v in args.items() if n_ in k.params})
        out[gi] = buf.cpu().to(torch.int64).numpy()
    return out


def _v2_rank(k, step: ExplicitStep, r: int, rb: RankBatch, T: int, device, written) -> np.ndarray:
    G = len(step.groups)
    out = np.full((G, T), PAD_SLOT_ID, dtype=np.int64)
    tabs = [_t(t if t is not None else np.zeros((1, 1)), torch.int32, device) for t in rb.tables]
    per_group = "group_cp_sizes" in k.params
    launches: dict[tuple[int, int], list[int]] = {}
    for gi, g in enumerate(step.groups):
        n = g.world(step.cp)
        if g.circular and "is_circular" not in k.params:
            raise ConfigError(f"--kernel-{step.path}", f"{k.spec} has no is_circular flag; group {g.name} is a "
                                                       f"sliding-window ring, so its captured inputs cannot be rerun")
        if not g.slot_mapped and "slot_mapping_enabled" not in k.params:
            continue
        key = (step.cp.world, r) if per_group or n > 1 else (1, 0)
        launches.setdefault(key, []).append(gi)
    dtype = torch.int32 if k.abi == "ascend-v2" else torch.int64
    for (n, rank), gis in launches.items():
        buf = torch.full((len(gis), T), POISON, dtype=dtype, device=device)

        def i32(values):
            return torch.tensor(list(values), dtype=torch.int32, device=device)
        idx = _t(rb.idx_mapping, torch.int32, device)
        qsl = _t(np.minimum(rb.query_start_loc, T), torch.int32, device)
        pos = _t(rb.positions, torch.int64, device)
        args = dict(
            num_tokens=min(rb.num_tokens_padded if k.abi == "builtin" else rb.num_scheduled, T), max_num_tokens=T,
            idx_mapping=idx, query_start_loc=qsl, pos=pos,
            block_table_ptrs=torch.tensor([tabs[i].data_ptr() for i in gis], dtype=torch.int64, device=device),
            block_table_strides=torch.tensor([tabs[i].stride(0) for i in gis], dtype=torch.int64, device=device),
            block_sizes=i32(step.entry_sizes[i] for i in gis),
            slot_mappings_ptr=buf, slot_mappings_stride=buf.stride(0), cp_rank=rank, CP_SIZE=n,
            CP_INTERLEAVE=step.cp.interleave, PAD_ID=PAD_SLOT_ID, TRITON_BLOCK_SIZE=TILE,
            BLOCK_TABLE_WINDOW_SIZE=kernels.window_size(TILE, min(step.entry_sizes[i] for i in gis)),
            BLOCK_TABLE_PAD_SIZE=kernels.next_pow2(max(tabs[i].stride(0) for i in gis)),
            slot_mapping_enabled=i32(int(step.groups[i].slot_mapped) for i in gis), HAS_SLOT_MAPPING_ENABLED=True,
            group_cp_sizes=i32(step.groups[i].world(step.cp) for i in gis),
            is_circular=i32(int(step.groups[i].circular) for i in gis),
            is_padding=_t(rb.is_padding if rb.is_padding is not None else np.zeros(rb.num_scheduled, bool),
                          torch.bool, device),
        )
        watched = [(gis[0], "positions", pos), (gis[0], "query_start_loc", qsl), (gis[0], "idx_mapping", idx)]
        with _intact.bracket(written, watched + [(i, "block table", tabs[i]) for i in gis]):
            k.obj[(len(gis), rb.num_reqs + 1)](**{n_: v for n_, v in args.items() if n_ in k.params})
        out[gis] = buf.cpu().to(torch.int64).numpy()
    return out


@dataclass
class Rerun:
    """A kernel's rerun on every rank of a step: the slots, and the input entries it wrote (None: cpsim's own)."""

    slots: list[np.ndarray]             # per rank: int64 [groups, entries]
    written: list[np.ndarray] | None    # per rank: int64 [groups, inputs] (``cpsim.paths._intact.INPUTS``)


def run(step: ExplicitStep, kernel=None, device: str = "cpu", runner=None) -> Rerun:
    """Per-rank ``[groups, entries]`` slots of ``kernel`` (None: cpsim's built-in kernel of the step's path).

    A user's kernel runs in a worker of ``runner`` (the caller's; none: one of its own), one rank at a
    time (``KernelRunner.call``): it is
    imported and called there only, and each rank's slots and written-input counts come back as plain
    arrays. Raises ``KernelFailed`` naming the rank on which it raised, exited, crashed or hung."""
    own = [gi for rb in step.ranks for gi in range(len(step.groups)) if rb.own_tokens(gi) is not None]
    if own:
        raise ConfigError(f"--kernel-{step.path}", f"group {step.groups[own[0]].name} has its own positions "
                                                   f"(g{own[0]}/positions): no rerun ABI launches a group on its own "
                                                   f"tokens yet; give the slots it produced (r<R>/slots)")
    if kernel is None:
        k = _builtin(step.path)
        return Rerun([rank_slots(k, step, r, device)[0] for r in range(len(step.ranks))], None)
    rerunnable = ("ascend-v1", "ascend-v2", "vllm-v2") + rerun_released.RELEASED
    if kernel.load_failure is None and kernel.abi not in rerunnable:
        raise ConfigError(f"--kernel-{step.path}", f"{kernel.spec}: rerunning captured inputs supports the "
                                                   f"{', '.join(rerunnable)} ABIs, not {kernel.abi}")
    if kernel.load_failure is None and kernel.abi in rerun_released.RELEASED:
        rerun_released.check_tables(kernel, step)
    from cpsim.run.runner import given
    with given(runner) as kr:
        outs = [kr.call(rank_slots, step.path, kernel, step, r, device, rank=r, device=device)
                for r in range(len(step.ranks))]
    return Rerun([slots for slots, _ in outs], [written for _, written in outs])


def rank_slots(k, step: ExplicitStep, r: int, device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Rank ``r``'s ``[groups, entries]`` slots of the loaded kernel ``k`` (in a kernel worker for a user's)
    and the entries of its inputs it wrote, int64 ``[groups, inputs]`` (``cpsim.paths._intact``): every
    launch is bracketed, so a kernel that stores into its block table is seen (``inputs-intact``)."""
    if k.abi != "builtin":
        from cpsim.paths._inputs import prepare_triton
        prepare_triton(torch.device(device))
    rb = step.ranks[r]
    T = rb.slots.shape[1] if rb.slots is not None else step.limits.slot_buffer_size
    fn = rerun_released.rank if k.abi in rerun_released.RELEASED else _v1_rank if step.path == "v1" else _v2_rank
    written = _intact.counts(len(step.groups))
    out = fn(k, step, r, rb, T, torch.device(device), written if k.abi != "builtin" else None)
    if rb.is_padding is not None and "is_padding" not in k.params:
        # The runtime masks flagged tokens around a kernel that does not take the flags.
        flagged = np.nonzero(rb.is_padding)[0]
        out[:, flagged[flagged < T]] = PAD_SLOT_ID
    _replay_pass(step, rb, out)
    return out, written.numpy()


def _replay_pass(step: ExplicitStep, rb: RankBatch, out: np.ndarray) -> None:
    """The runtime's replay padding after the slot-mapping kernel (SPEC §3, cpsim's rule on the host): a
    replayed position is PAD in every prefix-cacheable group. The kernel rerun is the slot-mapping one."""
    if rb.replay_start is None or not rb.replay_start.any():
        return
    w = max(g.prefix_replay_tokens for g in step.groups)
    n = min(rb.num_scheduled, out.shape[1])
    start = rb.replay_start[rb.token_requests()][:n]
    pos = rb.positions[:n]
    replayed = (start > 0) & (pos >= start) & (pos < start + w)
    for gi, g in enumerate(step.groups):
        if g.pads_replay:
            out[gi, :n][replayed] = PAD_SLOT_ID

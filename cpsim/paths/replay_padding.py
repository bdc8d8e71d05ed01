"""Prefix-cache replay padding: the launch every path runs after its slot-mapping kernels.

Upstream (vLLM #56227, ``DeepseekV41ModelState.prepare_attn``; vllm-ascend's
``pad_replayed_slot_mapping``) this is a separate pass over the slot mappings the
slot-mapping kernels just wrote, run only when some request of the batch replays
and some group is prefix-cacheable. It is the same on every path and every rank:
replayed positions are compared with the request's logical positions, before any
CP owner transform, and only PAD is written, so a position another rank owns stays
PAD. cpsim runs it on the rank's ``[groups, entries]`` int64 buffer (rows framed
by guards), with cpsim's kernel or the user's (``--kernel-replay``).
"""

from __future__ import annotations

import numpy as np
import torch

from cpsim import kernels
from cpsim.layout import PAD_SLOT_ID
from cpsim.paths import adapters
from cpsim.paths._inputs import prepare_triton
from cpsim.paths.prep import PerRank
from cpsim.paths.types import Knobs
from cpsim.scenario import Scenario

BLOCK = 1024  # upstream's launch


def cacheable_groups(s: Scenario, knobs: Knobs = Knobs()) -> list[int]:
    """Indices of the groups the pass pads: the prefix-cacheable ones with slots (upstream builds the
    list from ``spec.prefix_cacheable``; vllm-ascend leaves mamba groups out, they have no slot mapping)."""
    if knobs.kernel_fault & kernels.FAULT_REPLAY_ALL_GROUPS:  # replay-pads-every-group: the host lists them all
        return list(range(len(s.groups)))
    return [gi for gi, g in enumerate(s.groups) if g.pads_replay]


def runs(s: Scenario, knobs: Knobs = Knobs()) -> bool:
    """Whether the pass launches at all (upstream: a window, a replaying request, a group to pad)."""
    return s.replay_window > 0 and s.batch.has_replay and bool(cacheable_groups(s, knobs))


def replay_starts(s: Scenario) -> np.ndarray:
    """int32 [num_reqs]: each batch entry's replay start, 0 where it does not replay."""
    return np.asarray([r.replay_start for r in s.batch.requests], dtype=np.int32)


def pad(s: Scenario, slots: torch.Tensor, prep: PerRank, knobs: Knobs = Knobs(), kernel=None) -> None:
    """Overwrite, in place, the replayed tokens of the cacheable groups in ``slots`` ([groups, entries]),
    with inputs from the rank run's ``prep``.

    ``kernel``: the user's replay kernel (a ``KernelUnderTest``) instead of cpsim's."""
    if not runs(s, knobs):
        return
    groups = cacheable_groups(s, knobs)
    prepare_triton(prep.device)
    T = slots.shape[1]
    # a short buffer drops tokens; capacity reports it
    common = (("replay", tuple(groups), T), lambda: [replay_starts(s), np.asarray(groups, dtype=np.int32)])
    bt, (starts, group_ids) = prep.batch(clamp=T, shared=common)
    qsl = bt.query_start_loc
    names = ",".join(s.groups[gi].name for gi in groups)
    prep.launch(f"replay-pad({names})" if kernel is None else f"replay-pad[{kernel.spec}]({names})")
    if kernel is not None:
        adapters.replay(kernel, s, slots, qsl, bt.positions, starts, groups, prep)
        return
    from cpsim.kernels.replay_pad import _pad_replayed_slots_kernel
    _pad_replayed_slots_kernel[(s.batch.num_reqs,)](
        slots, slots.stride(0), group_ids, qsl, bt.positions,
        starts, s.replay_window, PAD_SLOT_ID, NUM_GROUPS=len(groups), BLOCK=BLOCK,
        FAULT=knobs.kernel_fault & kernels.REPLAY_FAULTS,
    )

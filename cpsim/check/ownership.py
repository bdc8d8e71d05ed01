"""Who holds which positions: per (path, sharded group, request, rank), owned positions expected vs held.

The table people read first when an ownership invariant breaks: it shows at a glance
which rank lost or gained which positions. A pure function over gathered arrays, so
every report (``run``, ``bugs reproduce``, torchrun) can print it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpsim.check import coordinator
from cpsim.layout import PAD_SLOT_ID, owner_rank
from cpsim.scenario import Scenario


@dataclass
class Ownership:
    path: str
    group: str
    request: int
    rank: int
    expected: list[int]    # positions the rank should hold
    actual: list[int]      # positions it holds a real slot for


def ownership(s: Scenario, gathered: dict) -> list[Ownership]:
    """Per (path, sharded group, request, rank): owned positions expected vs held (replayed positions of
    a prefix-cacheable group are expected on no rank).

    Only (path, group, request) combinations where some rank differs are returned.
    """
    pos = torch.from_numpy(s.batch.positions())
    req = torch.from_numpy(s.batch.token_request())
    replayed = torch.from_numpy(s.replay_mask())  # PAD by design in the prefix-cacheable groups
    n = pos.numel()
    out: list[Ownership] = []
    for path, G in gathered.items():
        for gi, g in enumerate(s.groups):
            world = g.world(s.cp)
            if world == 1 or not g.slot_mapped or not bool(G.enabled[:, gi].all()):
                continue
            x = G.slots[:, gi, :n]
            if x.shape[1] < n:
                continue
            real = (x != PAD_SLOT_ID) & (x != coordinator.MISSING)
            owner = owner_rank(pos, world, s.cp.interleave)
            held = ~replayed if g.pads_replay else torch.ones_like(replayed)
            for i in range(s.batch.num_reqs):
                sel = req == i
                rows = [Ownership(path, g.name, i, rk, pos[sel & held & (owner == rk % world)].tolist(),
                                  pos[sel & real[rk]].tolist()) for rk in range(x.shape[0])]
                if any(o.expected != o.actual for o in rows):
                    out += rows
    return out


def ranges(values: list[int]) -> str:
    """Compact positions: [0,1,2,5] -> '0-2, 5'."""
    if not values:
        return "-"
    parts, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(parts)

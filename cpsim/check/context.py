"""What the invariants read: the check's scenario (``_Ctx``), one path's gathered arrays (``PathCase``), one
(path, group) with the profile's decisions for it (``GroupCase``), and the paths that ran (``AllPaths``);
each built once per check, path or (path, group) and shared by every invariant."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from cpsim import layout
from cpsim.allocator import Allocation
from cpsim.check import profiles, reference
from cpsim.check.findings import host_array, scheduled_entries
from cpsim.layout import PAD_SLOT_ID
from cpsim.scenario import INT32_MAX, Scenario


class _Ctx:
    """Per-check token arrays and per-group references, built once (numpy: the arrays are small
    and many, and a numpy operation on them costs a fraction of a torch one)."""

    def __init__(self, s: Scenario, allocs_world: list[list[Allocation]], profile=None):
        self.s = s
        self.profile = profile or profiles.PROFILES["cpsim"]
        self.padded = s.batch.num_tokens_padded
        self.allocs = allocs_world
        self.pos = s.batch.positions()
        self.req = s.batch.token_request()
        self.n = int(self.pos.size)
        self.pad = s.batch.padding_mask()  # is_padding tokens: PAD on every rank
        self.replayed = s.replay_mask()  # prefix-cache replay: PAD in cacheable groups
        self._want: dict[tuple[int, int], np.ndarray] = {}
        self._views: dict[int, _Ctx] = {}
        self._blocks: dict[tuple[int, ...], tuple] = {}

    def group(self, gi: int) -> "_Ctx":
        """The token arrays group ``gi``'s buffer is indexed by: the batch's, or the group's own where an
        explicit batch gives them (``GivenBatch.group_tokens``: a compressed / indexer group's positions
        and request of each token, vllm-ascend 0.23.0.post1 ``positions_compressed_list``)."""
        own = getattr(self.s.batch, "group_tokens", None)
        tokens = own(gi) if own is not None else None
        if tokens is None:
            return self
        if gi not in self._views:
            view = copy.copy(self)
            view.pos, view.req, view.pad = tokens
            view.n = int(view.pos.size)
            starts = np.array([r.replay_start for r in self.s.batch.requests], dtype=np.int64)[view.req]
            w = self.s.replay_window
            view.replayed = (starts > 0) & (view.pos >= starts) & (view.pos < starts + w)
            view._want = {}
            self._views[gi] = view
        return self._views[gi]

    def blocks(self, allocs: list[Allocation]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``reference.stacked_blocks(allocs)``, built once per check: the reference and dense-local need it
        for every path. Keyed by the allocations' ids, which live as long as this check (``self.allocs``)."""
        key = tuple(map(id, allocs))
        if key not in self._blocks:
            self._blocks[key] = reference.stacked_blocks(allocs)
        return self._blocks[key]

    def live(self, g, n: int) -> np.ndarray:
        """bool [n]: tokens group ``g`` must hold somewhere: not padding, and not replayed where the group
        keeps its prefix-cache KV (those are ``padding`` / ``replayed-is-pad``'s to judge)."""
        dead = self.pad | self.replayed if g.pads_replay else self.pad
        return ~(dead | (self.pos // g.block_size >= (g.row_blocks or INT32_MAX)))[:n]  # a tail row's end

    def sets(self, ranks: int, g) -> list[range]:
        """Replica sets of group ``g``: ``g`` consecutive ranks, one of each shard rank."""
        return layout.replica_sets(ranks, g.world(self.s.cp))

    def end(self, entries: int) -> int:
        """Buffer entries the profile promises (``padding_end``): past them nothing is judged."""
        return profiles.padding_end(self.profile, self.n, self.padded, entries)

    def want(self, gi: int, ranks: int, entries: int, state: str = "") -> np.ndarray:
        """[ranks, entries]: the reference buffer of group ``gi``, shared by every path. ``state``: "slots",
        a state group whose release computes slots (``profiles.state_slots``), mapped as a plain table;
        "pad", a group whose release disables its slot mapping (``profiles.ring_is_pad``)."""
        key = (gi, ranks, state)
        if state == "pad":
            return np.full((ranks, entries), PAD_SLOT_ID, dtype=np.int64)
        if key not in self._want:
            g = self.s.groups[gi]
            if state:
                g = profiles.state_as_table(self.s, self.profile, g)
            rows = list(range(ranks))
            allocs = [self.allocs[r][gi] for r in rows]
            self._want[key] = reference.world_slots(self.s, g, allocs, rows, self.pos, self.req, self.pad,
                                                    self.replayed, self.blocks(allocs) if g.slot_mapped else None)
        ref = self._want[key]
        out = np.full((ranks, entries), PAD_SLOT_ID, dtype=np.int64)
        m = min(self.n, entries)
        out[:, :m] = ref[:, :m]
        return out


class PathCase:
    """One path's gathered arrays of every rank, read as numpy once; its groups' cases in ``groups``.
    ``earlier``: group -> the case of the last path whose buffer of that group was judged afresh."""

    def __init__(self, ctx: _Ctx, path: str, gathered, earlier: dict[int, "GroupCase"]):
        self.ctx, self.path = ctx, path
        self.slots = host_array(gathered.slots)
        self.ranks, self.entries = self.slots.shape[0], self.slots.shape[2]
        self.enabled = host_array(gathered.enabled)
        self.widths = host_array(gathered.widths).T.tolist()  # [group][rank]
        self.entry_sizes = host_array(gathered.entry_sizes).T.tolist()
        self.guards = _optional(getattr(gathered, "guards", None))
        self.written = _optional(getattr(gathered, "written", None))
        self.faults = _optional(getattr(gathered, "output_faults", None))
        enabled_any = self.enabled.any(0).tolist()
        self.groups = [GroupCase(self, gi, g, enabled_any[gi], earlier) for gi, g in enumerate(ctx.s.groups)]


def _optional(x) -> np.ndarray | None:
    return None if x is None else host_array(x)


class GroupCase:
    """One (path, group): its arrays and the profile's decisions for it, made once. ``judged``: its slot
    buffer is judged (enabled, and the profile has a rule for it); ``state`` / ``ring``: by the release's
    rule for a state group that computes slots / a ring launched with slot mapping off (``padding`` and
    ``matches-reference`` only); ``mapped``: by the mapping invariants. ``same_as``: an earlier path's case
    with an equal buffer under the same rule, whose buffer-only violations this one takes (``found``)."""

    def __init__(self, p: PathCase, gi: int, g, enabled: bool, earlier: dict[int, "GroupCase"]):
        self.path, self.gi, self.g, self.ctx = p.path, gi, g, p.ctx.group(gi)
        self.ranks, self.entries = p.ranks, p.entries
        self.widths, self.entry_sizes = p.widths[gi], p.entry_sizes[gi]
        self.guards = None if p.guards is None else p.guards[:, gi]
        self.written = None if p.written is None else p.written[:, gi]
        self.faults = None if p.faults is None else p.faults[:, gi]
        profile = p.ctx.profile
        self.unjudged = profiles.not_judged(profile, p.path, g)
        self.judged = enabled and not self.unjudged
        self.state = self.judged and profiles.state_slots(profile, p.path, g)
        self.ring = self.judged and not self.state and profiles.ring_is_pad(profile, p.path, g)
        self.mapped = self.judged and not (self.state or self.ring) and g.slot_mapped
        self.world = g.world(p.ctx.s.cp)
        self.token_entries = self.ranks * self.ctx.n  # ``x.size`` without building ``x``
        self.found: dict[str, list] = {}
        self.same_as = None
        self._x = None
        if not self.judged:
            return
        self.full = p.slots[:, gi, :]
        self.rule = (self.state, self.ring, self.entry_sizes)
        seen = earlier.get(gi)
        if seen is not None and seen.rule == self.rule and np.array_equal(seen.full, self.full):
            self.same_as = seen
        else:
            earlier[gi] = self

    @property
    def x(self) -> np.ndarray:
        """[ranks, n] the scheduled tokens' entries (``scheduled_entries``), built on first use."""
        if self._x is None:
            self._x = scheduled_entries(self.ctx, self.full)
        return self._x

    def allocs(self) -> list[Allocation]:
        """Every rank's allocation of this group."""
        return [a[self.gi] for a in self.ctx.allocs]


@dataclass
class AllPaths:
    """What the invariants across paths read: the check's context, the cases of the paths that ran (in the
    order gathered), and each rank's scenario fingerprint."""

    ctx: _Ctx
    cases: list[PathCase]
    fingerprints: list[str] | None

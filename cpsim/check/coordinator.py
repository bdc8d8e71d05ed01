"""The oracle: invariants of SPEC §4 over all-gathered slot mappings.

Pure functions of (scenario, allocation, gathered tensors). No processes, no I/O,
and no import of the kernels being judged: expected values come from
``cpsim.layout`` and ``cpsim.check.reference`` only. Everything is vectorised over
tokens and ranks, in numpy; Python loops run over paths and groups, and over the ranks or
replica sets that failed (to word their violations).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import numpy as np

from cpsim import layout
from cpsim.check import profiles, reference
from cpsim.allocator import Allocation
from cpsim.layout import GUARD, PAD_SLOT_ID, POISON, cdiv
from cpsim.scenario import INT32_MAX, Scenario

INVARIANTS = (
    "kernel-completes",
    "guard-intact",
    "inputs-intact",
    "kernel-output",
    "row-bounds",
    "exactly-one-owner",
    "owner-rule",
    "replicas-agree",
    "dense-local",
    "no-collision",
    "block-sizing",
    "capacity",
    "padding",
    "replayed-is-pad",
    "matches-reference",
    "paths-agree",
    "same-scenario",
)
MISSING = POISON  # also marks tokens a short buffer could not hold
MAX_EXAMPLES = 5


@dataclass
class Example:
    rank: int | None
    request: int | None
    position: int | None
    expected: str
    actual: str


@dataclass
class Violation:
    invariant: str
    path: str
    group: str
    count: int
    message: str
    ranks: list[int] = field(default_factory=list)
    examples: list[Example] = field(default_factory=list)


@dataclass
class Verdict:
    invariant: str
    path: str
    status: str                  # "pass" | "fail" | "n/a" | "not run"
    checked: int = 0             # entries or items examined
    violations: list[Violation] = field(default_factory=list)
    note: str = ""               # why a verdict is "not run"

    @property
    def count(self) -> int:
        return sum(v.count for v in self.violations)


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


def _examples(ctx: _Ctx, idx, actual, expected, rank: int | None, show=None) -> list[Example]:
    out = []
    for t in np.asarray(idx)[:MAX_EXAMPLES].tolist():
        exp = expected(t) if callable(expected) else expected
        got = show(int(actual[t])) if show else _fmt(int(actual[t]))
        out.append(Example(rank, int(ctx.req[t]) if t < ctx.n else None, int(ctx.pos[t]) if t < ctx.n else None,
                           str(exp), got))
    return out


def _fmt(v: int) -> str:
    return {PAD_SLOT_ID: "PAD", MISSING: "unwritten"}.get(v, str(v))


def _tokens(ctx: _Ctx, slots: np.ndarray) -> np.ndarray:
    """[ranks, n] scheduled-token entries; tokens past a short buffer read as MISSING."""
    r, t = slots.shape
    if t >= ctx.n:
        return slots[:, : ctx.n]
    return np.concatenate([slots, np.full((r, ctx.n - t), MISSING, dtype=slots.dtype)], 1)


def _real(x: np.ndarray) -> np.ndarray:
    return (x != PAD_SLOT_ID) & (x != MISSING)


def _np(x) -> np.ndarray:
    """A gathered tensor (torch, on any device) as a host numpy array. A host tensor outside autograd (what
    the virtual world gathers) is viewed as it is: ``detach().cpu()`` cost more than the view, for every
    field of every path of every fuzz scenario."""
    if not hasattr(x, "detach"):
        return np.asarray(x)
    try:
        return x.numpy()
    except (RuntimeError, TypeError):  # on a device, or needing grad: the way round
        return x.detach().cpu().numpy()


def _nz(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(mask)`` through the array's own methods (no dispatch wrappers: called ~20 times a check)."""
    return np.asanyarray(mask).ravel().nonzero()[0]


def _rows(mask: np.ndarray) -> list[int]:
    """Indices of the rows of a [rows, n] mask with any entry set."""
    return mask.any(1).nonzero()[0].tolist()


# ---- invariants on one (path, group); every array is [ranks, entries] ----------------

def exactly_one_owner(ctx, path, g, x) -> list[Violation]:
    """Sharded groups: one holder per replica set. Padding tokens have none; they are the
    ``padding`` invariant's to judge, so they are left out here."""
    real = _real(x)
    world = g.world(ctx.s.cp)
    live = ctx.live(g, x.shape[1])
    if world > 1:
        out = []
        sets = ctx.sets(x.shape[0], g)
        cnt = real.reshape(len(sets), world, -1).sum(1)  # [sets, n]
        bad_all = (cnt != 1) & live
        for k in _rows(bad_all):
            ranks = sets[k]
            bad = _nz(bad_all[k])
            where = "" if world == x.shape[0] else f" of replica set {ranks.start}..{ranks.stop - 1}"
            out.append(Violation(
                "exactly-one-owner", path, g.name, len(bad),
                f"{len(bad)} token(s) held by {sorted(set(cnt[k][bad].tolist()))} ranks{where} instead of 1",
                list(ranks) if where else [],
                [Example(None, int(ctx.req[t]), int(ctx.pos[t]), "1 rank",
                         f"{int(cnt[k, t])} ranks: {(_nz(real[ranks.start:ranks.stop, t]) + ranks.start).tolist()}")
                 for t in bad[:MAX_EXAMPLES].tolist()]))
        return out
    out = []
    missing = _nz((~real).any(0) & live)
    if len(missing):
        ranks = sorted(set(np.nonzero(~real[:, missing])[0].tolist()))
        out.append(Violation("exactly-one-owner", path, g.name, len(missing),
                             f"unsharded group: {len(missing)} token(s) missing on some rank (every rank holds all)",
                             ranks, [Example(None, int(ctx.req[t]), int(ctx.pos[t]), "a slot on every rank",
                                             f"PAD on ranks {_nz(~real[:, t]).tolist()}")
                                     for t in missing[:MAX_EXAMPLES].tolist()]))
    differ = _nz((x != x[:1]).any(0))
    if len(differ):
        out.append(Violation("exactly-one-owner", path, g.name, len(differ),
                             f"unsharded group: ranks disagree on {len(differ)} token(s)",
                             examples=[Example(None, int(ctx.req[t]), int(ctx.pos[t]), _fmt(int(x[0, t])),
                                               str([_fmt(v) for v in x[:, t].tolist()]))
                                       for t in differ[:MAX_EXAMPLES].tolist()]))
    return out


def owner_rule(ctx, path, g, x) -> list[Violation]:
    world = g.world(ctx.s.cp)
    if world == 1:
        return []
    shard = layout.owner_rank(ctx.pos, world, ctx.s.cp.interleave)
    live = ctx.live(g, x.shape[1])
    real = _real(x)
    sets = ctx.sets(x.shape[0], g)
    held = real.reshape(len(sets), world, -1)[:, shard, np.arange(x.shape[1])]  # [sets, n]: the owner holds it
    bad_all = ~held & live
    out = []
    for k in _rows(bad_all):
        ranks = sets[k]
        owner = shard + ranks.start  # the holder inside this replica set
        bad = _nz(bad_all[k])
        rule = f"(p // {ctx.s.cp.interleave}) % {world}" + (f" + {ranks.start}" if ranks.start else "")
        out.append(Violation("owner-rule", path, g.name, len(bad),
                             f"{len(bad)} token(s) not stored on rank {rule}",
                             sorted(set(owner[bad].tolist())),
                             [Example(int(owner[t]), int(ctx.req[t]), int(ctx.pos[t]),
                                      f"real slot on rank {int(owner[t])}",
                                      f"PAD there; held by {_nz(real[:, t]).tolist()}")
                              for t in bad[:MAX_EXAMPLES].tolist()]))
    return out


def replicas_agree(ctx, path, g, full) -> list[Violation]:
    """Ranks with the same shard rank ``r % g`` hold the same copy: identical buffers."""
    world = g.world(ctx.s.cp)
    full = full[:, :ctx.end(full.shape[1])]
    twins = np.arange(world, full.shape[0]) % world
    differ = full[world:] != full[twins]
    out = []
    for k in _rows(differ):
        r, twin = world + k, int(twins[k])
        diff = _nz(differ[k])
        out.append(Violation("replicas-agree", path, g.name, len(diff),
                             f"rank {r} differs from its replica rank {twin} (shard rank {r} % {world}) "
                             f"in {len(diff)} entr(ies)", [twin, r],
                             _examples(ctx, diff, full[r], lambda t: f"{_fmt(int(full[twin, t]))} (rank {twin})",
                                       r)))
    return out


def dense_local(ctx, path, g, x, allocs) -> list[Violation]:
    """Every held token at block ``j // B``, offset ``j % B`` of its rank's blocks, where ``j`` counts the
    positions before it that the rank owns (global rule), so each rank's slots fill its blocks densely."""
    if g.circular:
        return []
    world = g.world(ctx.s.cp)
    B = g.block_size
    rr, tt = np.nonzero(_real(x))  # (rank, token) pairs held: only those can break the rule
    j = layout.owned_before(ctx.pos[tt], rr % world, world, ctx.s.cp.interleave)
    blocks, widths, live = ctx.blocks(allocs)
    bi = j // B
    reqs, width = blocks.shape[1], blocks.shape[2]
    inside = (bi < widths[rr]) & (bi < live[rr, ctx.req[tt]]) if len(rr) else bi < 0
    want_block = np.where(inside, blocks.reshape(-1)[(rr * reqs + ctx.req[tt]) * width + np.minimum(bi, width - 1)]
                          if len(rr) else bi, -1)
    # got // B == block and got % B == j % B, in one comparison
    bad = ~inside | (x[rr, tt] != want_block * B + (j - bi * B))
    out = []
    for r in np.unique(rr[bad]).tolist():
        on = bad & (rr == r)
        idx = tt[on]
        k = MAX_EXAMPLES
        info = dict(zip(idx[:k].tolist(), zip(j[on][:k].tolist(), bi[on][:k].tolist(), inside[on][:k].tolist(),
                                              want_block[on][:k].tolist())))
        out.append(Violation(
            "dense-local", path, g.name, len(idx),
            f"rank {r}: {len(idx)} token(s) not at block j // {B}, offset j % {B} of the rank's blocks",
            [r], _examples(ctx, idx, x[r],
                           lambda t: f"block {info[t][3]} offset {info[t][0] % B} (j={info[t][0]})"
                           if info[t][2] else f"block #{info[t][1]} (not allocated)", r,
                           show=lambda v: f"block {v // B} offset {v % B} (slot {v})")))
    return out


def no_collision(ctx, path, g, x) -> list[Violation]:
    cap = g.num_blocks * g.block_size
    held = _real(x)
    outside = held & ((x < 0) | (x >= cap))
    dups = _duplicates(ctx, g, x, held)
    out = []
    for r in sorted(set(_rows(outside)) | set(dups)):
        if outside[r].any():
            idx = _nz(outside[r])
            out.append(Violation("no-collision", path, g.name, len(idx),
                                 f"rank {r}: {len(idx)} slot(s) outside the cache [0, {cap})", [r],
                                 _examples(ctx, idx, x[r], f"in [0, {cap})", r)))
        if r in dups:
            dup = dups[r]
            idx = _nz(np.isin(x[r], dup) & held[r])
            out.append(Violation("no-collision", path, g.name, len(dup),
                                 f"rank {r}: {len(dup)} slot(s) written by more than one token", [r],
                                 _examples(ctx, idx, x[r], "a slot of its own", r)))
    return out


def _duplicates(ctx, g, x: np.ndarray, held: np.ndarray) -> dict[int, np.ndarray]:
    """rank -> the sorted distinct slots that rank holds for more than one token; one sort over the
    (rank, slot) pairs of all ranks. A circular group's ring overwrites within a request by design:
    there a (request, slot) pair counts once."""
    rr, tt = np.nonzero(held)
    slots = x[rr, tt]
    if g.circular:
        req = ctx.req[tt]
        order = np.lexsort((slots, req, rr))
        rr, req, slots = rr[order], req[order], slots[order]
        first = np.ones(rr.size, dtype=bool)
        first[1:] = (rr[1:] != rr[:-1]) | (req[1:] != req[:-1]) | (slots[1:] != slots[:-1])
        rr, slots = rr[first], slots[first]
    order = np.lexsort((slots, rr))
    rr, slots = rr[order], slots[order]
    again = (rr[1:] == rr[:-1]) & (slots[1:] == slots[:-1])
    if not again.any():
        return {}
    dr, dv = rr[1:][again], slots[1:][again]
    distinct = np.ones(dr.size, dtype=bool)
    distinct[1:] = (dr[1:] != dr[:-1]) | (dv[1:] != dv[:-1])
    dr, dv = dr[distinct], dv[distinct]
    return {r: dv[dr == r] for r in np.unique(dr).tolist()}


def padding(ctx, path, g, full: np.ndarray) -> list[Violation]:
    """Entries past the scheduled tokens must be PAD, up to what the profile promises (the whole buffer,
    or the padded count); no scheduled entry may keep the poison."""
    out = []
    tail = full[:, ctx.n:ctx.end(full.shape[1])]
    bad = tail != PAD_SLOT_ID
    if bad.any():
        ranks = _rows(bad)
        r = ranks[0]
        idx = _nz(bad[r])
        out.append(Violation("padding", path, g.name, int(bad.sum()),
                             f"{int(bad.sum())} entr(ies) after the last scheduled token "
                             f"(index {ctx.n}) are not PAD; first at index {ctx.n + int(idx[0])}"
                             f"{_reach(ctx, full.shape[1])}", ranks,
                             [Example(r, None, None, f"PAD at index {ctx.n + t}", _fmt(int(tail[r, t])))
                              for t in idx[:MAX_EXAMPLES].tolist()]))
    m = min(ctx.n, full.shape[1])
    flagged = full[:, :m][:, ctx.pad[:m]]
    bad = flagged != PAD_SLOT_ID
    if bad.any():
        idx = _nz(ctx.pad[:m])
        ranks = _rows(bad)
        r = ranks[0]
        out.append(Violation("padding", path, g.name, int(bad.sum()),
                             f"{int(bad.sum())} entr(ies) of padding tokens (is_padding, a dummy request's, a negative "
                             f"position) are not PAD", ranks,
                             _examples(ctx, idx[bad[r]], full[r], "PAD (is_padding)", r)))
    head = full[:, : ctx.n] == MISSING
    if head.any():
        ranks = _rows(head)
        out.append(Violation("padding", path, g.name, int(head.sum()),
                             f"{int(head.sum())} scheduled entr(ies) left at the poison value", ranks))
    return out


def replayed_is_pad(ctx, path, g, full: np.ndarray) -> list[Violation]:
    """Prefix-cache replay: a replayed position is PAD on every rank in a prefix-cacheable group (its
    cached blocks are shared; rewriting them puts values the sharers do not read there), and keeps its
    real slot on the ranks that hold it in a group that is not (that write is what rebuilds it)."""
    m = min(ctx.n, full.shape[1])  # tokens past a short buffer are the capacity invariant's
    x = full[:, :m]
    rep = ctx.replayed[:m]
    if g.pads_replay:
        bad = rep & (x != PAD_SLOT_ID).any(0)
        idx = _nz(bad)
        if not len(idx):
            return []
        ranks = _rows(x[:, idx] != PAD_SLOT_ID)
        r = ranks[0]
        return [Violation("replayed-is-pad", path, g.name, len(idx),
                          f"{len(idx)} replayed token(s) of prefix-cacheable group {g.name} not PAD: the replay "
                          f"would rewrite cached blocks other requests share", ranks,
                          _examples(ctx, idx[x[r, idx] != PAD_SLOT_ID], x[r], "PAD (replayed, cacheable)", r))]
    world = g.world(ctx.s.cp)
    ranks = np.arange(x.shape[0])[:, None]
    if world > 1:
        holder = ranks % world == layout.owner_rank(ctx.pos[:m], world, ctx.s.cp.interleave)[None, :]
    else:
        holder = np.ones(x.shape, dtype=bool)
    lost = holder & ~_real(x) & (rep & ctx.live(g, m))[None, :]  # padding and a tail row's end excepted
    if not lost.any():
        return []
    which = _rows(lost)
    r = which[0]
    return [Violation("replayed-is-pad", path, g.name, int(lost.sum()),
                      f"{int(lost.sum())} entr(ies) of replayed tokens lost their slot in group {g.name}, which is "
                      f"not prefix-cacheable: the replay is what rebuilds its KV", which,
                      _examples(ctx, _nz(lost[r]), x[r], "its real slot (not cacheable)", r))]


def _reach(ctx, entries: int) -> str:
    end = ctx.end(entries)
    return "" if end == entries else f" (profile {ctx.profile.name}: PAD up to the padded count, index {end})"


def _state_unjudged(ctx, g, allocs) -> np.ndarray:
    """bool [n]: tokens of a slot-computed state group past the request's live blocks (the release reads a
    table entry that holds no state block there; cpsim does not model what it holds)."""
    _, _, live = ctx.blocks(allocs)
    k, _, _ = reference.group_index(ctx.s, profiles.state_as_table(ctx.s, ctx.profile, g), ctx.pos)
    return k // g.bpk >= live[0, ctx.req]


def matches_reference(ctx, path, g, gi, full, state_allocs=None, disabled=False) -> list[Violation]:
    """Each rank's buffer equals the reference up to the profile's reach. ``state_allocs``: a state group
    whose release computes slots, judged by its rule on the tokens inside its live blocks; ``disabled``: a
    group its release launches with slot mapping disabled (all PAD)."""
    end = ctx.end(full.shape[1])
    mode = "pad" if disabled else ("slots" if state_allocs is not None else "")
    want = ctx.want(gi, full.shape[0], full.shape[1], mode)[:, :end]
    full = full[:, :end]
    differ = full != want
    if state_allocs is not None:
        skip = _state_unjudged(ctx, g, state_allocs)[:end]
        differ[:, :skip.size] &= ~skip[None, :]
    out = []
    for r in _rows(differ):
        bad = _nz(differ[r])
        wr = want[r]
        out.append(Violation("matches-reference", path, g.name, len(bad),
                             f"rank {r}: {len(bad)} entr(ies) differ from the reference", [r],
                             _examples(ctx, bad, full[r], lambda t: _fmt(int(wr[t])), r)))
    return out


def block_sizing(ctx, path, g, widths: list[int], entry_sizes: list[int]) -> list[Violation]:
    """Each rank's table holds every entry its group's spec needs. cpsim's profile also wants the exact
    width; a release profile accepts wider tables (vLLM aligns to 128 tokens; ``--strict-sizing`` notes it)."""
    s = ctx.s
    mml = s.limits.max_model_len
    world = g.world(s.cp)
    prof = ctx.profile
    out = []
    for r, (w, e) in enumerate(zip(widths, entry_sizes)):
        if g.circular or g.row_blocks:  # a ring, a tail group: its row's blocks, by design
            need, exact = (g.row_blocks or 1) * (g.block_size // e), None
        elif not g.slot_mapped and prof.state_width == "spec":
            # vLLM's MambaSpec has two widths: 1 + speculative blocks (state-indexed rows), or one entry per
            # block of max_model_len in align mode (position-indexed rows, what cpsim allocates); either is
            # a table that release builds, so the narrower of the two is the need.
            spec = profiles.state_entries(prof, mml, g.block_size, s.limits.num_speculative_tokens)
            need = min(spec, cdiv(mml, g.block_size)) * (g.block_size // e)
            exact = None
        elif prof.width_rule != "exact":
            need = layout.max_table_index(mml, g.block_size, e, world, s.cp.interleave) + 1
            exact = None
        else:
            need = layout.max_table_index(mml, g.block_size, e, world, s.cp.interleave) + 1
            exact = layout.table_width(mml, g.block_size, world) * (g.block_size // e) if world > 1 else None
        if w < need:
            out.append(Violation("block-sizing", path, g.name, 1,
                                 f"rank {r}: table width {w} < {need} entries needed for positions "
                                 f"< max_model_len {mml} (block out of range)", [r]))
        elif exact is not None and w != exact:
            out.append(Violation("block-sizing", path, g.name, 1,
                                 f"rank {r}: table width {w} != cdiv({mml}, {g.block_size} x {world})"
                                 f"{' x ' + str(g.block_size // e) if g.block_size != e else ''} = {exact}", [r]))
    return out


def sizing_waste(s: Scenario, gathered: dict, profile=None) -> list[str]:
    """``--strict-sizing``: tables wider and slot buffers larger than the profile's rule, one line each.

    Waste, not a violation: a wider table or a bigger buffer maps every token right. The rule is
    the widest table the profile's host builds (cpsim: exact ``cdiv(mml, B·g)``; vLLM >= 0.27:
    the spec's entries rounded up to 128 tokens, ``get_block_table_width``)."""
    prof = profile or profiles.PROFILES["cpsim"]
    mml = s.limits.max_model_len
    out = []
    for path, G in gathered.items():
        if getattr(G, "failures", None):
            continue
        widths, entry_sizes = _np(G.widths).T.tolist(), _np(G.entry_sizes).T.tolist()
        for gi, g in enumerate(s.groups):
            for r, (w, e) in enumerate(zip(widths[gi], entry_sizes[gi])):
                per = g.block_size // e
                if g.circular:
                    rule = per
                elif not g.slot_mapped and prof.state_width == "spec":
                    rule = profiles.state_entries(prof, mml, g.block_size, s.limits.num_speculative_tokens) * per
                else:
                    need = layout.max_table_index(mml, g.block_size, e, g.world(s.cp), s.cp.interleave) + 1
                    phys = layout.cdiv(need, per)
                    if prof.width_rule == "aligned-128" and g.slot_mapped:
                        phys = profiles.aligned_width(phys, g.block_size)
                    rule = phys * per
                if w > rule:
                    out.append(f"{path} group {g.name} rank {r}: table width {w} > {rule} entries the "
                               f"{prof.name} rule needs ({w - rule} unused per row)")
        entries = _np(G.slots).shape[2]
        need = profiles.slot_buffer_need(prof, s.limits, path)
        if entries > need:
            out.append(f"{path}: slot buffer {entries} > {need} entries (scheduled tokens"
                       f"{' + MTP drafts' if profiles.draft_reserve(prof, path) else ''})")
    return out


def capacity(ctx, path, entries: int) -> list[Violation]:
    """The slot buffer holds what the profile's host must hold (``profiles.slot_buffer_need``) and
    every entry this batch writes (a profile without the draft reserve still cannot drop tokens)."""
    lim = ctx.s.limits
    reserve = profiles.draft_reserve(ctx.profile, path)
    host = profiles.slot_buffer_need(ctx.profile, lim, path)
    demand = max(ctx.n, ctx.s.batch.num_tokens_padded)  # a spec request's scheduled tokens hold its drafts
    need = max(host, demand)
    if entries >= need:
        return []
    rule = (f"{lim.max_num_batched_tokens} batched + {max(lim.num_speculative_tokens - 1, 0)} draft x "
            f"{lim.max_num_reqs} requests" if reserve
            else f"{lim.max_num_batched_tokens} batched under {ctx.profile.name}")
    rule = rule if need == host else f"max({rule}, the {demand} this batch writes)"
    return [Violation("capacity", path, "*", need - entries,
                      f"slot buffer holds {entries} entries; needs {need} = {rule} (this batch writes {demand})")]


def guard_intact(ctx, path, g, guards: np.ndarray, entries: int) -> list[Violation]:
    """The guard entries framing each output row (gathered as [ranks, 2 * width]) still hold GUARD."""
    width = guards.shape[1] // 2
    broken = guards != GUARD
    out = []
    for r in _rows(broken):
        bad = _nz(broken[r]).tolist()
        index = [c - width if c < width else entries + c - width for c in bad]
        out.append(Violation("guard-intact", path, g.name, len(bad),
                             f"rank {r}: {len(bad)} guard entr(ies) around the slot buffer overwritten: the kernel "
                             f"wrote outside [0, {entries}) (max_num_tokens {entries}); first at index {index[0]}",
                             [r], [Example(r, None, None, f"untouched guard at index {i}", _fmt(int(guards[r, c])))
                                   for i, c in list(zip(index, bad))[:MAX_EXAMPLES]]))
    return out


# The columns of a gathered ``written`` array (``cpsim.paths._intact.INPUTS``; the oracle keeps its own copy).
INPUT_NAMES = ("positions", "query_start_loc", "idx_mapping", "block table")


def inputs_intact(ctx, path, g, written: np.ndarray) -> list[Violation]:
    """The kernel left every input it was handed as it was (``written`` [ranks, inputs]: entries changed)."""
    out = []
    for r in _rows(written > 0):
        for col in _nz(written[r] > 0).tolist():
            n = int(written[r, col])
            name = INPUT_NAMES[col]
            what = f"group {g.name}'s block table" if name == "block table" else name
            out.append(Violation("inputs-intact", path, g.name, n,
                                 f"kernel wrote {n} entr{'y' if n == 1 else 'ies'} of {what} on rank {r} (inputs "
                                 f"are the kernel's to read: a runtime keeps them for the next step)", [r]))
    return out


# A callable's result's faults by code (``cpsim.paths.adapters.OUTPUT_FAULTS``, same order).
OUTPUT_FAULTS = ("", "not a tensor", "not 1-D", "floating-point", "complex", "bool", "on another device",
                 "shorter than the scheduled tokens", "longer than the slot buffer")


def kernel_output(ctx, path, g, faults: np.ndarray) -> list[Violation]:
    """The callable returned a 1-D integer tensor of slots on the device (``faults`` [ranks] codes)."""
    out = []
    for r in _nz(faults > 0).tolist():
        code = int(faults[r])
        what = OUTPUT_FAULTS[code] if code < len(OUTPUT_FAULTS) else f"fault {code}"
        out.append(Violation("kernel-output", path, g.name, 1,
                             f"kernel returned a result that is {what} for group {g.name} on rank {r}; the callable "
                             f"ABI returns a 1-D integer tensor of slots on the kernel's device", [r]))
    return out


def row_bounds(ctx, path, g, full: np.ndarray, entry_sizes: list[int]) -> list[Violation]:
    """No slot comes from a guard entry of the block table (past a row's width, or above/below the table)."""
    e = np.asarray(entry_sizes, dtype=np.int64)[:, None]
    gid = np.asarray([layout.table_guard_id(g.num_blocks, g.block_size, v) for v in entry_sizes],
                     dtype=np.int64)[:, None]
    hits = (full >= 0) & (full // e == gid)
    out = []
    for r in _rows(hits):
        hit = _nz(hits[r])
        out.append(Violation("row-bounds", path, g.name, len(hit),
                             f"rank {r}: {len(hit)} entr(ies) read outside table row: their slots come from "
                             f"guard block id {int(gid[r, 0])}, held only past each row's width and around the table",
                             [r], _examples(ctx, hit, full[r], "a block of the request's own row", r)))
    return out


def _ranges(ranks: list[int]) -> str:
    """``[1, 2, 3, 6, 7]`` as ``1-3, 6-7``."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(f"{start}-{r}" if r != start else f"{r}")
            start = None
    return ", ".join(out)


def kernel_failed(path: str, failure, world: int) -> list[Verdict]:
    """A path whose kernel raised, crashed, hung or ended its process on a rank: that is its verdict."""
    left = failure.not_run
    rest = "" if not left else (f"; rank {left[0]} not run" if len(left) == 1 else
                                f"; ranks {_ranges(left)} not run")
    vio = Violation("kernel-completes", path, failure.group, 1, failure.message + rest, [failure.rank])
    why = f"the kernel did not complete on rank {failure.rank}"
    return [Verdict("kernel-completes", path, "fail", world, [vio])] + [
        Verdict(inv, path, "not run", note=why) for inv in INVARIANTS
        if inv not in ("kernel-completes", "paths-agree", "same-scenario")]


def not_run(path: str, reason: str) -> list[Verdict]:
    """Verdicts for a requested path that was not run, so every report states it."""
    return [Verdict(inv, path, "not run", note=reason) for inv in INVARIANTS
            if inv not in ("paths-agree", "same-scenario")]


# ---- whole check -------------------------------------------------------------

def _slot_invariants(ctx, path, g, gi, full, entry_sizes: list[int], allocs, state: bool, ring_is_pad: bool
                     ) -> list[tuple[str, int, list[Violation]]]:
    """(invariant, entries checked, violations) of what one path's buffer of group ``gi`` decides alone
    (``full``: [ranks, entries]); ``state`` / ``ring_is_pad``: the profile's rule for the group on this path."""
    if state or ring_is_pad:
        return [("padding", full.size, padding(ctx, path, g, full)),
                ("matches-reference", full.size,
                 matches_reference(ctx, path, g, gi, full, allocs if state else None, disabled=not state))]
    x = _tokens(ctx, full)
    out = [("padding", full.size, padding(ctx, path, g, full))]
    if g.slot_mapped and ctx.replayed.any():
        out.append(("replayed-is-pad", int(ctx.replayed.sum()) * full.shape[0], replayed_is_pad(ctx, path, g, full)))
    out.append(("matches-reference", full.size, matches_reference(ctx, path, g, gi, full)))
    if not g.slot_mapped:
        return out
    out.append(("row-bounds", full.size, row_bounds(ctx, path, g, full, entry_sizes)))
    world = g.world(ctx.s.cp)
    out.append(("exactly-one-owner", x.size, exactly_one_owner(ctx, path, g, x)))
    if world > 1:
        out.append(("owner-rule", x.size, owner_rule(ctx, path, g, x)))
    out.append(("no-collision", x.size, no_collision(ctx, path, g, x)))
    if world < full.shape[0]:
        out.append(("replicas-agree", full.size, replicas_agree(ctx, path, g, full)))
    if not g.circular:
        out.append(("dense-local", x.size, dense_local(ctx, path, g, x, allocs)))
    return out


def check(s: Scenario, allocs_world: list[list[Allocation]], gathered: dict, fingerprints: list[str] | None = None,
          profile: "profiles.Profile | None" = None) -> list[Verdict]:
    """Every invariant for every gathered path; one Verdict per (invariant, path), judged by ``profile``
    (default: cpsim's model)."""
    s = profiles.scenario_for(s, profile or profiles.PROFILES["cpsim"])
    ctx = _Ctx(s, allocs_world, profile)
    verdicts: list[Verdict] = []
    earlier: dict[int, tuple] = {}  # group -> (rule, buffer, judged) of the first path that had it
    for path, G in gathered.items():
        failures = getattr(G, "failures", None) or []
        if failures:
            verdicts += kernel_failed(path, failures[0], s.cp.world)
            continue
        found: dict[str, list[Violation]] = {k: [] for k in INVARIANTS}
        checked: dict[str, int] = {k: 0 for k in INVARIANTS}
        applies: dict[str, bool] = {k: False for k in INVARIANTS}
        slots = _np(G.slots)
        entries = slots.shape[2]
        widths, entry_sizes = _np(G.widths).T.tolist(), _np(G.entry_sizes).T.tolist()  # [group][rank]
        enabled_any = _np(G.enabled).any(0).tolist()
        found["capacity"] += capacity(ctx, path, entries)
        applies["capacity"] = True
        checked["capacity"] = 1
        applies["kernel-completes"] = True
        checked["kernel-completes"] = slots.shape[0]
        guards = getattr(G, "guards", None)
        guards = _np(guards) if guards is not None else None
        written = getattr(G, "written", None)
        written = _np(written) if written is not None else None
        faults = getattr(G, "output_faults", None)
        faults = _np(faults) if faults is not None else None
        for gi, g in enumerate(s.groups):
            gctx = ctx.group(gi)
            if faults is not None and g.slot_mapped:
                applies["kernel-output"] = True
                checked["kernel-output"] += faults.shape[0]
                found["kernel-output"] += kernel_output(gctx, path, g, faults[:, gi])
            if written is not None and (written[:, gi] >= 0).all():  # -1: a rank ran cpsim's own kernels
                applies["inputs-intact"] = True
                checked["inputs-intact"] += written[:, gi].size
                found["inputs-intact"] += inputs_intact(gctx, path, g, written[:, gi])
            found["block-sizing"] += block_sizing(gctx, path, g, widths[gi], entry_sizes[gi])
            applies["block-sizing"] = True
            checked["block-sizing"] += len(widths[gi])
            if guards is not None:
                applies["guard-intact"] = True
                checked["guard-intact"] += guards[:, gi].size
                found["guard-intact"] += guard_intact(gctx, path, g, guards[:, gi], entries)
            if not enabled_any[gi] or profiles.not_judged(ctx.profile, path, g):
                continue
            full = slots[:, gi, :]
            state = profiles.state_slots(ctx.profile, path, g)
            ring = not state and profiles.ring_is_pad(ctx.profile, path, g)
            key = (state, ring, entry_sizes[gi])
            seen = earlier.get(gi)
            if seen is not None and seen[0] == key and np.array_equal(seen[1], full):
                # The same buffer as an earlier path's (both paths right, or wrong alike): the same verdicts,
                # which name no path but in ``Violation.path``: a quarter of the fuzz loop's check time.
                judged = [(inv, n, [dataclasses.replace(v, path=path) for v in vios]) for inv, n, vios in seen[2]]
            else:
                judged = _slot_invariants(gctx, path, g, gi, full, entry_sizes[gi], [a[gi] for a in allocs_world],
                                          state, ring)
                earlier[gi] = (key, full, judged)
            for inv, n, vios in judged:
                applies[inv] = True
                checked[inv] += n
                found[inv] += vios
        for inv in INVARIANTS:
            if inv in ("paths-agree", "same-scenario"):
                continue
            status = "n/a" if not applies[inv] else ("fail" if found[inv] else "pass")
            verdicts.append(Verdict(inv, path, status, checked[inv], found[inv]))
    verdicts += paths_agree(ctx, gathered)
    verdicts.append(same_scenario(fingerprints))
    return verdicts


def paths_agree(ctx, gathered: dict) -> list[Verdict]:
    names = [n for n in gathered if not getattr(gathered[n], "failures", None)]  # a failed path has no slots
    if len(names) < 2:
        return [Verdict("paths-agree", "*", "n/a")]
    base = names[0]
    out = []
    for other in names[1:]:
        A, Bt = gathered[base], gathered[other]
        vios, checked = [], 0
        m = ctx.end(min(A.slots.shape[2], Bt.slots.shape[2]))
        sa, sb = _np(A.slots), _np(Bt.slots)
        both = (_np(A.enabled) & _np(Bt.enabled)).all(0).tolist() if sa.shape[0] == sb.shape[0] else []
        for gi, g in enumerate(ctx.s.groups):
            if gi >= len(both) or not both[gi] or any(profiles.not_judged(ctx.profile, p, g) for p in (base, other)):
                continue
            a, b = sa[:, gi, :m], sb[:, gi, :m]
            checked += a.size
            differ = a != b
            count = int(differ.sum())
            if count:
                ranks = _rows(differ)
                r = ranks[0]
                vios.append(Violation("paths-agree", f"{base}~{other}", g.name, count,
                                      f"{base} and {other} differ in {count} entr(ies)", ranks,
                                      _examples(ctx, _nz(differ[r]), b[r],
                                                lambda t: f"{_fmt(int(a[r, t]))} ({base})", r)))
        out.append(Verdict("paths-agree", f"{base}~{other}", "fail" if vios else "pass", checked, vios))
    return out


def same_scenario(fingerprints: list[str] | None) -> Verdict:
    if not fingerprints:
        return Verdict("same-scenario", "*", "n/a")
    ref = fingerprints[0]
    odd = [r for r, f in enumerate(fingerprints) if f != ref]
    if not odd:
        return Verdict("same-scenario", "*", "pass", len(fingerprints))
    return Verdict("same-scenario", "*", "fail", len(fingerprints), [Violation(
        "same-scenario", "*", "*", len(odd),
        f"rank(s) {odd} built a different scenario than rank 0 ({', '.join(sorted(set(fingerprints)))})", odd)])


def passed(verdicts: list[Verdict]) -> bool:
    return all(v.status != "fail" for v in verdicts)

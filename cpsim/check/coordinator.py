"""The oracle: invariants of SPEC §4 over all-gathered slot mappings.

Pure functions of (scenario, allocation, gathered tensors). No processes, no I/O,
and no import of the kernels being judged: expected values come from
``cpsim.layout`` and ``cpsim.check.reference`` only. Everything is vectorised over
tokens; the only Python loops run over paths, groups and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cpsim import layout
from cpsim.check import reference
from cpsim.allocator import Allocation
from cpsim.layout import GUARD, PAD_SLOT_ID, POISON
from cpsim.scenario import Scenario

INVARIANTS = (
    "kernel-completes",
    "guard-intact",
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
    """Per-check token arrays, built once."""

    def __init__(self, s: Scenario):
        self.s = s
        self.pos = torch.from_numpy(s.batch.positions())
        self.req = torch.from_numpy(s.batch.token_request())
        self.n = int(self.pos.numel())
        self.pad = torch.from_numpy(s.batch.padding_mask())  # is_padding tokens: PAD on every rank
        self.replayed = torch.from_numpy(s.replay_mask())  # prefix-cache replay: PAD in cacheable groups

    def live(self, g, n: int) -> torch.Tensor:
        """bool [n]: tokens group ``g`` must hold somewhere: not padding, and not replayed where the group
        keeps its prefix-cache KV (those are ``padding`` / ``replayed-is-pad``'s to judge)."""
        dead = self.pad | self.replayed if g.pads_replay else self.pad
        return ~dead[:n]

    def sets(self, ranks: int, g) -> list[range]:
        """Replica sets of group ``g``: ``g`` consecutive ranks, one of each shard rank."""
        return layout.replica_sets(ranks, g.world(self.s.cp))


def _examples(ctx: _Ctx, idx: torch.Tensor, actual: torch.Tensor, expected, rank: int | None,
              show=None) -> list[Example]:
    out = []
    for t in idx[:MAX_EXAMPLES].tolist():
        exp = expected(t) if callable(expected) else expected
        got = show(int(actual[t])) if show else _fmt(int(actual[t]))
        out.append(Example(rank, int(ctx.req[t]) if t < ctx.n else None, int(ctx.pos[t]) if t < ctx.n else None,
                           str(exp), got))
    return out


def _fmt(v: int) -> str:
    return {PAD_SLOT_ID: "PAD", MISSING: "unwritten"}.get(v, str(v))


def _tokens(ctx: _Ctx, slots: torch.Tensor) -> torch.Tensor:
    """[ranks, n] scheduled-token entries; tokens past a short buffer read as MISSING."""
    r, t = slots.shape
    if t >= ctx.n:
        return slots[:, : ctx.n]
    return torch.cat([slots, torch.full((r, ctx.n - t), MISSING, dtype=slots.dtype)], 1)


def _real(x: torch.Tensor) -> torch.Tensor:
    return (x != PAD_SLOT_ID) & (x != MISSING)


# ---- invariants on one (path, group) ----------------------------------------

def exactly_one_owner(ctx, path, g, x) -> list[Violation]:
    """Sharded groups: one holder per replica set. Padding tokens have none; they are the
    ``padding`` invariant's to judge, so they are left out here."""
    real = _real(x)
    world = g.world(ctx.s.cp)
    live = ctx.live(g, x.shape[1])
    if world > 1:
        out = []
        for ranks in ctx.sets(x.shape[0], g):
            cnt = real[ranks.start:ranks.stop].sum(0)
            bad = ((cnt != 1) & live).nonzero().flatten()
            if len(bad):
                where = "" if world == x.shape[0] else f" of replica set {ranks.start}..{ranks.stop - 1}"
                out.append(Violation(
                    "exactly-one-owner", path, g.name, len(bad),
                    f"{len(bad)} token(s) held by {sorted(set(cnt[bad].tolist()))} ranks{where} instead of 1",
                    list(ranks) if where else [],
                    [Example(None, int(ctx.req[t]), int(ctx.pos[t]), "1 rank",
                             f"{int(cnt[t])} ranks: {(real[ranks.start:ranks.stop, t].nonzero().flatten() + ranks.start).tolist()}")
                     for t in bad[:MAX_EXAMPLES].tolist()]))
        return out
    out = []
    missing = ((~real).any(0) & live).nonzero().flatten()
    if len(missing):
        ranks = sorted(set((~real[:, missing]).nonzero()[:, 0].tolist()))
        out.append(Violation("exactly-one-owner", path, g.name, len(missing),
                             f"unsharded group: {len(missing)} token(s) missing on some rank (every rank holds all)",
                             ranks, [Example(None, int(ctx.req[t]), int(ctx.pos[t]), "a slot on every rank",
                                             f"PAD on ranks {(~real[:, t]).nonzero().flatten().tolist()}")
                                     for t in missing[:MAX_EXAMPLES].tolist()]))
    differ = (x != x[:1]).any(0).nonzero().flatten()
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
    out = []
    for ranks in ctx.sets(x.shape[0], g):
        owner = shard + ranks.start  # the holder inside this replica set
        held = _real(x).gather(0, owner.unsqueeze(0)).squeeze(0)
        bad = (~held & live).nonzero().flatten()
        if len(bad):
            rule = f"(p // {ctx.s.cp.interleave}) % {world}" + (f" + {ranks.start}" if ranks.start else "")
            out.append(Violation("owner-rule", path, g.name, len(bad),
                                 f"{len(bad)} token(s) not stored on rank {rule}",
                                 sorted(set(owner[bad].tolist())),
                                 [Example(int(owner[t]), int(ctx.req[t]), int(ctx.pos[t]),
                                          f"real slot on rank {int(owner[t])}",
                                          f"PAD there; held by {_real(x)[:, t].nonzero().flatten().tolist()}")
                                  for t in bad[:MAX_EXAMPLES].tolist()]))
    return out


def replicas_agree(ctx, path, g, full) -> list[Violation]:
    """Ranks with the same shard rank ``r % g`` hold the same copy: identical buffers."""
    world = g.world(ctx.s.cp)
    out = []
    for r in range(world, full.shape[0]):
        twin = r % world
        diff = (full[r] != full[twin]).nonzero().flatten()
        if len(diff):
            out.append(Violation("replicas-agree", path, g.name, len(diff),
                                 f"rank {r} differs from its replica rank {twin} (shard rank {r} % {world}) "
                                 f"in {len(diff)} entr(ies)", [twin, r],
                                 _examples(ctx, diff, full[r], lambda t: f"{_fmt(int(full[twin, t]))} (rank {twin})",
                                           r)))
    return out


def dense_local(ctx, path, g, x, allocs) -> list[Violation]:
    if g.circular:
        return []
    world = g.world(ctx.s.cp)
    B = g.block_size
    out = []
    for r in range(x.shape[0]):
        held = _real(x[r]).nonzero().flatten()  # only held tokens can break the rule
        if not len(held):
            continue
        j = layout.owned_before(ctx.pos[held], layout.shard_rank(r, world), world, ctx.s.cp.interleave)
        blocks = allocs[r].padded()
        bi = j // B
        inside = bi < blocks.shape[1]
        want_block = torch.where(inside, blocks[ctx.req[held], bi.clamp(max=blocks.shape[1] - 1)], -1)
        got = x[r][held]
        bad = ~inside | (got // B != want_block) | (got % B != j % B)
        sel = bad.nonzero().flatten()
        idx = held[sel]
        # examples index per-token arrays: scatter what they read back to token positions
        j = torch.zeros_like(ctx.pos).index_put_((held,), j)
        bi = torch.zeros_like(ctx.pos).index_put_((held,), bi)
        inside = torch.zeros_like(ctx.pos, dtype=torch.bool).index_put_((held,), inside)
        want_block = torch.full_like(ctx.pos, -1).index_put_((held,), want_block)
        if len(idx):
            out.append(Violation(
                "dense-local", path, g.name, len(idx),
                f"rank {r}: {len(idx)} token(s) not at block j // {B}, offset j % {B} of the rank's blocks",
                [r], _examples(ctx, idx, x[r],
                               lambda t: f"block {int(want_block[t])} offset {int(j[t] % B)} (j={int(j[t])})"
                               if bool(inside[t]) else f"block #{int(bi[t])} (not allocated)", r,
                               show=lambda v: f"block {v // B} offset {v % B} (slot {v})")))
    return out


def no_collision(ctx, path, g, x) -> list[Violation]:
    cap = g.num_blocks * g.block_size
    out = []
    for r in range(x.shape[0]):
        held = _real(x[r])
        slots = x[r][held]
        outside = ((slots < 0) | (slots >= cap)).nonzero().flatten()
        if len(outside):
            idx = held.nonzero().flatten()[outside]
            out.append(Violation("no-collision", path, g.name, len(outside),
                                 f"rank {r}: {len(outside)} slot(s) outside the cache [0, {cap})", [r],
                                 _examples(ctx, idx, x[r], f"in [0, {cap})", r)))
        if g.circular:  # the ring overwrites within a request by design
            pairs = torch.unique(torch.stack([ctx.req[held], slots]), dim=1)
            slots = pairs[1]
        dup = _duplicates(slots, cap)
        if len(dup):
            idx = (torch.isin(x[r], dup) & held).nonzero().flatten()
            out.append(Violation("no-collision", path, g.name, len(dup),
                                 f"rank {r}: {len(dup)} slot(s) written by more than one token", [r],
                                 _examples(ctx, idx, x[r], "a slot of its own", r)))
    return out


def _duplicates(slots: torch.Tensor, cap: int) -> torch.Tensor:
    """Sorted distinct values occurring more than once (a histogram when the cache is small)."""
    inside = slots[(slots >= 0) & (slots < cap)]
    if 0 < cap <= max(8 * slots.numel(), 1 << 20):
        counts = torch.bincount(inside, minlength=cap)
        dup = (counts > 1).nonzero().flatten()
        outside = slots[(slots < 0) | (slots >= cap)]
        if len(outside):
            srt, _ = torch.sort(outside)
            dup = torch.cat([dup, srt[1:][srt[1:] == srt[:-1]].unique()]).unique()
        return dup
    srt, _ = torch.sort(slots)
    return srt[1:][srt[1:] == srt[:-1]].unique()


def padding(ctx, path, g, full: torch.Tensor) -> list[Violation]:
    """Entries past the scheduled tokens must be PAD; no entry may keep the poison."""
    out = []
    tail = full[:, ctx.n:]
    bad = tail != PAD_SLOT_ID
    if bad.any():
        ranks = sorted(set(bad.nonzero()[:, 0].tolist()))
        r = ranks[0]
        idx = bad[r].nonzero().flatten()
        out.append(Violation("padding", path, g.name, int(bad.sum()),
                             f"{int(bad.sum())} entr(ies) after the last scheduled token "
                             f"(index {ctx.n}) are not PAD; first at index {ctx.n + int(idx[0])}", ranks,
                             [Example(r, None, None, f"PAD at index {ctx.n + t}", _fmt(int(tail[r, t])))
                              for t in idx[:MAX_EXAMPLES].tolist()]))
    m = min(ctx.n, full.shape[1])
    flagged = full[:, :m][:, ctx.pad[:m]]
    bad = flagged != PAD_SLOT_ID
    if bad.any():
        idx = ctx.pad[:m].nonzero().flatten()
        ranks = sorted(set(bad.nonzero()[:, 0].tolist()))
        r = ranks[0]
        out.append(Violation("padding", path, g.name, int(bad.sum()),
                             f"{int(bad.sum())} entr(ies) of is_padding tokens are not PAD", ranks,
                             _examples(ctx, idx[bad[r]], full[r], "PAD (is_padding)", r)))
    head = full[:, : ctx.n] == MISSING
    if head.any():
        ranks = sorted(set(head.nonzero()[:, 0].tolist()))
        out.append(Violation("padding", path, g.name, int(head.sum()),
                             f"{int(head.sum())} scheduled entr(ies) left at the poison value", ranks))
    return out


def replayed_is_pad(ctx, path, g, full: torch.Tensor) -> list[Violation]:
    """Prefix-cache replay: a replayed position is PAD on every rank in a prefix-cacheable group (its
    cached blocks are shared; rewriting them puts values the sharers do not read there), and keeps its
    real slot on the ranks that hold it in a group that is not (that write is what rebuilds it)."""
    m = min(ctx.n, full.shape[1])  # tokens past a short buffer are the capacity invariant's
    x = full[:, :m]
    rep = ctx.replayed[:m]
    if g.pads_replay:
        bad = rep & (x != PAD_SLOT_ID).any(0)
        idx = bad.nonzero().flatten()
        if not len(idx):
            return []
        ranks = sorted(set((x[:, idx] != PAD_SLOT_ID).nonzero()[:, 0].tolist()))
        r = ranks[0]
        return [Violation("replayed-is-pad", path, g.name, len(idx),
                          f"{len(idx)} replayed token(s) of prefix-cacheable group {g.name} not PAD: the replay "
                          f"would rewrite cached blocks other requests share", ranks,
                          _examples(ctx, idx[x[r, idx] != PAD_SLOT_ID], x[r], "PAD (replayed, cacheable)", r))]
    world = g.world(ctx.s.cp)
    ranks = torch.arange(x.shape[0]).unsqueeze(1)
    if world > 1:
        holder = ranks % world == layout.owner_rank(ctx.pos[:m], world, ctx.s.cp.interleave).unsqueeze(0)
    else:
        holder = torch.ones_like(x, dtype=torch.bool)
    lost = holder & ~_real(x) & (rep & ~ctx.pad[:m]).unsqueeze(0)
    if not bool(lost.any()):
        return []
    which = sorted(set(lost.nonzero()[:, 0].tolist()))
    r = which[0]
    return [Violation("replayed-is-pad", path, g.name, int(lost.sum()),
                      f"{int(lost.sum())} entr(ies) of replayed tokens lost their slot in group {g.name}, which is "
                      f"not prefix-cacheable: the replay is what rebuilds its KV", which,
                      _examples(ctx, lost[r].nonzero().flatten(), x[r], "its real slot (not cacheable)", r))]


def matches_reference(ctx, path, g, gi, full, allocs_world) -> list[Violation]:
    out = []
    index = reference.group_index(ctx.s, g, ctx.pos) if g.slot_mapped and not g.circular and ctx.n else None
    for r in range(full.shape[0]):
        want = torch.full((full.shape[1],), PAD_SLOT_ID, dtype=torch.int64)
        m = min(ctx.n, full.shape[1])
        want[:m] = reference.group_slots(ctx.s, g, allocs_world[r][gi], r, ctx.pos, ctx.req, index)[:m]
        bad = (full[r] != want).nonzero().flatten()
        if len(bad):
            out.append(Violation("matches-reference", path, g.name, len(bad),
                                 f"rank {r}: {len(bad)} entr(ies) differ from the reference", [r],
                                 _examples(ctx, bad, full[r], lambda t: _fmt(int(want[t])), r)))
    return out


def block_sizing(ctx, path, g, widths: torch.Tensor, entry_sizes: torch.Tensor) -> list[Violation]:
    s = ctx.s
    mml = s.limits.max_model_len
    world = g.world(s.cp)
    out = []
    for r in range(widths.shape[0]):
        w, e = int(widths[r]), int(entry_sizes[r])
        if g.circular:
            need, exact = 1, None
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


def capacity(ctx, path, entries: int) -> list[Violation]:
    lim = ctx.s.limits
    need = lim.slot_buffer_size
    if entries >= need:
        return []
    draft = max(lim.num_speculative_tokens - 1, 0)
    demand = ctx.n + draft * ctx.s.batch.num_reqs
    return [Violation("capacity", path, "*", need - entries,
                      f"slot buffer holds {entries} entries; needs {need} = {lim.max_num_batched_tokens} batched "
                      f"+ {draft} draft x {lim.max_num_reqs} requests (this batch writes {demand})")]


def guard_intact(ctx, path, g, guards: torch.Tensor, entries: int) -> list[Violation]:
    """The guard entries framing each output row (gathered as [ranks, 2 * width]) still hold GUARD."""
    width = guards.shape[1] // 2
    out = []
    for r in range(guards.shape[0]):
        bad = (guards[r] != GUARD).nonzero().flatten().tolist()
        if not bad:
            continue
        index = [c - width if c < width else entries + c - width for c in bad]
        out.append(Violation("guard-intact", path, g.name, len(bad),
                             f"rank {r}: {len(bad)} guard entr(ies) around the slot buffer overwritten: the kernel "
                             f"wrote outside [0, {entries}) (max_num_tokens {entries}); first at index {index[0]}",
                             [r], [Example(r, None, None, f"untouched guard at index {i}", _fmt(int(guards[r, c])))
                                   for i, c in list(zip(index, bad))[:MAX_EXAMPLES]]))
    return out


def row_bounds(ctx, path, g, full: torch.Tensor, entry_sizes: torch.Tensor) -> list[Violation]:
    """No slot comes from a guard entry of the block table (past a row's width, or above/below the table)."""
    out = []
    for r in range(full.shape[0]):
        e = int(entry_sizes[r])
        gid = layout.table_guard_id(g.num_blocks, g.block_size, e)
        hit = ((full[r] >= 0) & (torch.div(full[r], e, rounding_mode="floor") == gid)).nonzero().flatten()
        if len(hit):
            out.append(Violation("row-bounds", path, g.name, len(hit),
                                 f"rank {r}: {len(hit)} entr(ies) read outside table row: their slots come from "
                                 f"guard block id {gid}, held only past each row's width and around the table",
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

def check(s: Scenario, allocs_world: list[list[Allocation]], gathered: dict, fingerprints: list[str] | None = None,
          ) -> list[Verdict]:
    """Every invariant for every gathered path; one Verdict per (invariant, path)."""
    ctx = _Ctx(s)
    verdicts: list[Verdict] = []
    for path, G in gathered.items():
        failures = getattr(G, "failures", None) or []
        if failures:
            verdicts += kernel_failed(path, failures[0], s.cp.world)
            continue
        found: dict[str, list[Violation]] = {k: [] for k in INVARIANTS}
        checked: dict[str, int] = {k: 0 for k in INVARIANTS}
        applies: dict[str, bool] = {k: False for k in INVARIANTS}
        entries = G.slots.shape[2]
        found["capacity"] += capacity(ctx, path, entries)
        applies["capacity"] = True
        checked["capacity"] = 1
        applies["kernel-completes"] = True
        checked["kernel-completes"] = G.slots.shape[0]
        guards = getattr(G, "guards", None)
        for gi, g in enumerate(s.groups):
            enabled = G.enabled[:, gi]
            found["block-sizing"] += block_sizing(ctx, path, g, G.widths[:, gi], G.entry_sizes[:, gi])
            applies["block-sizing"] = True
            checked["block-sizing"] += G.widths.shape[0]
            if guards is not None:
                applies["guard-intact"] = True
                checked["guard-intact"] += guards[:, gi].numel()
                found["guard-intact"] += guard_intact(ctx, path, g, guards[:, gi], entries)
            if not bool(enabled.any()):
                continue
            full = G.slots[:, gi, :]
            x = _tokens(ctx, full)
            applies["padding"] = applies["matches-reference"] = True
            found["padding"] += padding(ctx, path, g, full)
            if g.slot_mapped and bool(ctx.replayed.any()):
                applies["replayed-is-pad"] = True
                checked["replayed-is-pad"] += int(ctx.replayed.sum()) * full.shape[0]
                found["replayed-is-pad"] += replayed_is_pad(ctx, path, g, full)
            found["matches-reference"] += matches_reference(ctx, path, g, gi, full, allocs_world)
            checked["padding"] += full.numel()
            checked["matches-reference"] += full.numel()
            if not g.slot_mapped:
                continue
            applies["row-bounds"] = True
            checked["row-bounds"] += full.numel()
            found["row-bounds"] += row_bounds(ctx, path, g, full, G.entry_sizes[:, gi])
            for name, fn in (("exactly-one-owner", exactly_one_owner), ("owner-rule", owner_rule),
                             ("no-collision", no_collision)):
                if name == "owner-rule" and g.world(s.cp) == 1:
                    continue
                applies[name] = True
                checked[name] += x.numel()
                found[name] += fn(ctx, path, g, x)
            if g.world(s.cp) < full.shape[0]:
                applies["replicas-agree"] = True
                checked["replicas-agree"] += full.numel()
                found["replicas-agree"] += replicas_agree(ctx, path, g, full)
            if not g.circular:
                applies["dense-local"] = True
                checked["dense-local"] += x.numel()
                found["dense-local"] += dense_local(ctx, path, g, x, [a[gi] for a in allocs_world])
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
        m = min(A.slots.shape[2], Bt.slots.shape[2])
        for gi, g in enumerate(ctx.s.groups):
            both = A.enabled[:, gi] & Bt.enabled[:, gi]
            if not bool(both.all()) or A.slots.shape[0] != Bt.slots.shape[0]:
                continue
            a, b = A.slots[:, gi, :m], Bt.slots[:, gi, :m]
            checked += a.numel()
            diff = (a != b).nonzero()
            if len(diff):
                r = int(diff[0, 0])
                idx = diff[diff[:, 0] == r][:, 1]
                vios.append(Violation("paths-agree", f"{base}~{other}", g.name, len(diff),
                                      f"{base} and {other} differ in {len(diff)} entr(ies)",
                                      sorted(set(diff[:, 0].tolist())),
                                      _examples(ctx, idx, b[r], lambda t: f"{_fmt(int(a[r, t]))} ({base})", r)))
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

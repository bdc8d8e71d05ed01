"""What each slot holds: no collision, padding, replayed tokens, the reference, the table's rows.

Every array is [ranks, entries] of one (path, group).
"""

from __future__ import annotations

import numpy as np

from cpsim import layout
from cpsim.check import profiles, reference
from cpsim.check.findings import (MAX_EXAMPLES, MISSING, Example, Violation, examples_at, flat_nonzero, is_real,
                                  rows_with_any, slot_text)
from cpsim.check.invariants import Invariant
from cpsim.layout import PAD_SLOT_ID


def no_collision(ctx, path, g, x) -> list[Violation]:
    cap = g.num_blocks * g.block_size
    held = is_real(x)
    outside = held & ((x < 0) | (x >= cap))
    dups = _duplicates(ctx, g, x, held)
    out = []
    for r in sorted(set(rows_with_any(outside)) | set(dups)):
        if outside[r].any():
            idx = flat_nonzero(outside[r])
            out.append(Violation("no-collision", path, g.name, len(idx),
                                 f"rank {r}: {len(idx)} slot(s) outside the cache [0, {cap})", [r],
                                 examples_at(ctx, idx, x[r], f"in [0, {cap})", r)))
        if r in dups:
            dup = dups[r]
            idx = flat_nonzero(np.isin(x[r], dup) & held[r])
            out.append(Violation("no-collision", path, g.name, len(dup),
                                 f"rank {r}: {len(dup)} slot(s) written by more than one token", [r],
                                 examples_at(ctx, idx, x[r], "a slot of its own", r)))
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
        ranks = rows_with_any(bad)
        r = ranks[0]
        idx = flat_nonzero(bad[r])
        out.append(Violation("padding", path, g.name, int(bad.sum()),
                             f"{int(bad.sum())} entr(ies) after the last scheduled token "
                             f"(index {ctx.n}) are not PAD; first at index {ctx.n + int(idx[0])}"
                             f"{_reach(ctx, full.shape[1])}", ranks,
                             [Example(r, None, None, f"PAD at index {ctx.n + t}", slot_text(int(tail[r, t])))
                              for t in idx[:MAX_EXAMPLES].tolist()]))
    m = min(ctx.n, full.shape[1])
    flagged = full[:, :m][:, ctx.pad[:m]]
    bad = flagged != PAD_SLOT_ID
    if bad.any():
        idx = flat_nonzero(ctx.pad[:m])
        ranks = rows_with_any(bad)
        r = ranks[0]
        out.append(Violation("padding", path, g.name, int(bad.sum()),
                             f"{int(bad.sum())} entr(ies) of padding tokens (is_padding, a dummy request's, a negative "
                             f"position) are not PAD", ranks,
                             examples_at(ctx, idx[bad[r]], full[r], "PAD (is_padding)", r)))
    head = full[:, : ctx.n] == MISSING
    if head.any():
        ranks = rows_with_any(head)
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
        idx = flat_nonzero(bad)
        if not len(idx):
            return []
        ranks = rows_with_any(x[:, idx] != PAD_SLOT_ID)
        r = ranks[0]
        return [Violation("replayed-is-pad", path, g.name, len(idx),
                          f"{len(idx)} replayed token(s) of prefix-cacheable group {g.name} not PAD: the replay "
                          f"would rewrite cached blocks other requests share", ranks,
                          examples_at(ctx, idx[x[r, idx] != PAD_SLOT_ID], x[r], "PAD (replayed, cacheable)", r))]
    world = g.world(ctx.s.cp)
    ranks = np.arange(x.shape[0])[:, None]
    if world > 1:
        holder = ranks % world == layout.owner_rank(ctx.pos[:m], world, ctx.s.cp.interleave)[None, :]
    else:
        holder = np.ones(x.shape, dtype=bool)
    lost = holder & ~is_real(x) & (rep & ctx.live(g, m))[None, :]  # padding and a tail row's end excepted
    if not lost.any():
        return []
    which = rows_with_any(lost)
    r = which[0]
    return [Violation("replayed-is-pad", path, g.name, int(lost.sum()),
                      f"{int(lost.sum())} entr(ies) of replayed tokens lost their slot in group {g.name}, which is "
                      f"not prefix-cacheable: the replay is what rebuilds its KV", which,
                      examples_at(ctx, flat_nonzero(lost[r]), x[r], "its real slot (not cacheable)", r))]


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
    for r in rows_with_any(differ):
        bad = flat_nonzero(differ[r])
        wr = want[r]
        out.append(Violation("matches-reference", path, g.name, len(bad),
                             f"rank {r}: {len(bad)} entr(ies) differ from the reference", [r],
                             examples_at(ctx, bad, full[r], lambda t: slot_text(int(wr[t])), r)))
    return out


def row_bounds(ctx, path, g, full: np.ndarray, entry_sizes: list[int]) -> list[Violation]:
    """No slot comes from a guard entry of the block table (past a row's width, or above/below the table)."""
    e = np.asarray(entry_sizes, dtype=np.int64)[:, None]
    gid = np.asarray([layout.table_guard_id(g.num_blocks, g.block_size, v) for v in entry_sizes],
                     dtype=np.int64)[:, None]
    hits = (full >= 0) & (full // e == gid)
    out = []
    for r in rows_with_any(hits):
        hit = flat_nonzero(hits[r])
        out.append(Violation("row-bounds", path, g.name, len(hit),
                             f"rank {r}: {len(hit)} entr(ies) read outside table row: their slots come from "
                             f"guard block id {int(gid[r, 0])}, held only past each row's width and around the table",
                             [r], examples_at(ctx, hit, full[r], "a block of the request's own row", r)))
    return out


ROW_BOUNDS = Invariant("row-bounds", "group", lambda c: row_bounds(c.ctx, c.path, c.g, c.full, c.entry_sizes),
                       lambda c: c.mapped, lambda c: c.full.size, buffer_only=True)
NO_COLLISION = Invariant("no-collision", "group", lambda c: no_collision(c.ctx, c.path, c.g, c.x),
                         lambda c: c.mapped, lambda c: c.token_entries, buffer_only=True)
PADDING = Invariant("padding", "group", lambda c: padding(c.ctx, c.path, c.g, c.full),
                    lambda c: c.judged, lambda c: c.full.size, buffer_only=True)
REPLAYED_IS_PAD = Invariant("replayed-is-pad", "group", lambda c: replayed_is_pad(c.ctx, c.path, c.g, c.full),
                            lambda c: c.mapped and c.ctx.replayed.any(),
                            lambda c: int(c.ctx.replayed.sum()) * c.ranks, buffer_only=True)
# A state group whose release computes slots is judged by its rule; a ring its release launches with
# slot mapping off is all PAD (``GroupCase.state`` / ``ring``).
MATCHES_REFERENCE = Invariant(
    "matches-reference", "group",
    lambda c: matches_reference(c.ctx, c.path, c.g, c.gi, c.full, c.allocs() if c.state else None, disabled=c.ring),
    lambda c: c.judged, lambda c: c.full.size, buffer_only=True)

"""Who holds each token: exactly one owner, the owner rule, replicas that agree, dense local slots.

Every array is [ranks, entries] of one (path, group).
"""

from __future__ import annotations

import numpy as np

from cpsim import layout
from cpsim.check.findings import (MAX_EXAMPLES, Example, Violation, examples_at, flat_nonzero, is_real, rows_with_any,
                                  slot_text)
from cpsim.check.invariants import Invariant


def exactly_one_owner(ctx, path, g, x) -> list[Violation]:
    """Sharded groups: one holder per replica set. Padding tokens have none; they are the
    ``padding`` invariant's to judge, so they are left out here."""
    real = is_real(x)
    world = g.world(ctx.s.cp)
    live = ctx.live(g, x.shape[1])
    if world > 1:
        out = []
        sets = ctx.sets(x.shape[0], g)
        cnt = real.reshape(len(sets), world, -1).sum(1)  # [sets, n]
        bad_all = (cnt != 1) & live
        for k in rows_with_any(bad_all):
            ranks = sets[k]
            bad = flat_nonzero(bad_all[k])
            where = "" if world == x.shape[0] else f" of replica set {ranks.start}..{ranks.stop - 1}"
            out.append(Violation(
                "exactly-one-owner", path, g.name, len(bad),
                f"{len(bad)} token(s) held by {sorted(set(cnt[k][bad].tolist()))} ranks{where} instead of 1",
                list(ranks) if where else [],
                [Example(None, int(ctx.req[t]), int(ctx.pos[t]), "1 rank",
                         f"{int(cnt[k, t])} ranks: "
                         f"{(flat_nonzero(real[ranks.start:ranks.stop, t]) + ranks.start).tolist()}")
                 for t in bad[:MAX_EXAMPLES].tolist()]))
        return out
    out = []
    missing = flat_nonzero((~real).any(0) & live)
    if len(missing):
        ranks = sorted(set(np.nonzero(~real[:, missing])[0].tolist()))
        out.append(Violation("exactly-one-owner", path, g.name, len(missing),
                             f"unsharded group: {len(missing)} token(s) missing on some rank (every rank holds all)",
                             ranks, [Example(None, int(ctx.req[t]), int(ctx.pos[t]), "a slot on every rank",
                                             f"PAD on ranks {flat_nonzero(~real[:, t]).tolist()}")
                                     for t in missing[:MAX_EXAMPLES].tolist()]))
    differ = flat_nonzero((x != x[:1]).any(0))
    if len(differ):
        out.append(Violation("exactly-one-owner", path, g.name, len(differ),
                             f"unsharded group: ranks disagree on {len(differ)} token(s)",
                             examples=[Example(None, int(ctx.req[t]), int(ctx.pos[t]), slot_text(int(x[0, t])),
                                               str([slot_text(v) for v in x[:, t].tolist()]))
                                       for t in differ[:MAX_EXAMPLES].tolist()]))
    return out


def owner_rule(ctx, path, g, x) -> list[Violation]:
    world = g.world(ctx.s.cp)
    if world == 1:
        return []
    shard = layout.owner_rank(ctx.pos, world, ctx.s.cp.interleave)
    live = ctx.live(g, x.shape[1])
    real = is_real(x)
    sets = ctx.sets(x.shape[0], g)
    held = real.reshape(len(sets), world, -1)[:, shard, np.arange(x.shape[1])]  # [sets, n]: the owner holds it
    bad_all = ~held & live
    out = []
    for k in rows_with_any(bad_all):
        ranks = sets[k]
        owner = shard + ranks.start  # the holder inside this replica set
        bad = flat_nonzero(bad_all[k])
        rule = f"(p // {ctx.s.cp.interleave}) % {world}" + (f" + {ranks.start}" if ranks.start else "")
        out.append(Violation("owner-rule", path, g.name, len(bad),
                             f"{len(bad)} token(s) not stored on rank {rule}",
                             sorted(set(owner[bad].tolist())),
                             [Example(int(owner[t]), int(ctx.req[t]), int(ctx.pos[t]),
                                      f"real slot on rank {int(owner[t])}",
                                      f"PAD there; held by {flat_nonzero(real[:, t]).tolist()}")
                              for t in bad[:MAX_EXAMPLES].tolist()]))
    return out


def replicas_agree(ctx, path, g, full) -> list[Violation]:
    """Ranks with the same shard rank ``r % g`` hold the same copy: identical buffers."""
    world = g.world(ctx.s.cp)
    full = full[:, :ctx.end(full.shape[1])]
    twins = np.arange(world, full.shape[0]) % world
    differ = full[world:] != full[twins]
    out = []
    for k in rows_with_any(differ):
        r, twin = world + k, int(twins[k])
        diff = flat_nonzero(differ[k])
        out.append(Violation("replicas-agree", path, g.name, len(diff),
                             f"rank {r} differs from its replica rank {twin} (shard rank {r} % {world}) "
                             f"in {len(diff)} entr(ies)", [twin, r],
                             examples_at(ctx, diff, full[r], lambda t: f"{slot_text(int(full[twin, t]))} (rank {twin})",
                                       r)))
    return out


def dense_local(ctx, path, g, x, allocs) -> list[Violation]:
    """Every held token at block ``j // B``, offset ``j % B`` of its rank's blocks, where ``j`` counts the
    positions before it that the rank owns (global rule), so each rank's slots fill its blocks densely."""
    if g.circular:
        return []
    world = g.world(ctx.s.cp)
    B = g.block_size
    rr, tt = np.nonzero(is_real(x))  # (rank, token) pairs held: only those can break the rule
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
            [r], examples_at(ctx, idx, x[r],
                           lambda t: f"block {info[t][3]} offset {info[t][0] % B} (j={info[t][0]})"
                           if info[t][2] else f"block #{info[t][1]} (not allocated)", r,
                           show=lambda v: f"block {v // B} offset {v % B} (slot {v})")))
    return out


EXACTLY_ONE_OWNER = Invariant("exactly-one-owner", "group", lambda c: exactly_one_owner(c.ctx, c.path, c.g, c.x),
                              lambda c: c.mapped, lambda c: c.token_entries, buffer_only=True)
OWNER_RULE = Invariant("owner-rule", "group", lambda c: owner_rule(c.ctx, c.path, c.g, c.x),
                       lambda c: c.mapped and c.world > 1, lambda c: c.token_entries, buffer_only=True)
REPLICAS_AGREE = Invariant("replicas-agree", "group", lambda c: replicas_agree(c.ctx, c.path, c.g, c.full),
                           lambda c: c.mapped and c.world < c.ranks, lambda c: c.full.size, buffer_only=True)
DENSE_LOCAL = Invariant("dense-local", "group", lambda c: dense_local(c.ctx, c.path, c.g, c.x, c.allocs()),
                        lambda c: c.mapped and not c.g.circular, lambda c: c.token_entries, buffer_only=True)

"""The oracle: invariants of SPEC §4 over all-gathered slot mappings.

Pure functions of (scenario, allocation, gathered tensors). No processes, no I/O,
and no import of the kernels being judged: expected values come from
``cpsim.layout`` and ``cpsim.check.reference`` only. Everything is vectorised over
tokens and ranks, in numpy; Python loops run over paths and groups, and over the ranks or
replica sets that failed (to word their violations).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cpsim.allocator import Allocation
from cpsim.check import profiles
from cpsim.check.context import _Ctx
from cpsim.check.findings import MAX_EXAMPLES, MISSING, Example, Verdict, Violation, _np, _tokens  # noqa: F401
from cpsim.check.invariants.agreement import paths_agree, same_scenario
from cpsim.check.invariants.kernel import (INPUT_NAMES, OUTPUT_FAULTS, guard_intact,  # noqa: F401
                                           inputs_intact, kernel_output)
from cpsim.check.invariants.owners import dense_local, exactly_one_owner, owner_rule, replicas_agree
from cpsim.check.invariants.sizing import block_sizing, capacity, sizing_waste  # noqa: F401
from cpsim.check.invariants.slots import matches_reference, no_collision, padding, replayed_is_pad, row_bounds
from cpsim.scenario import Scenario

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


def passed(verdicts: list[Verdict]) -> bool:
    return all(v.status != "fail" for v in verdicts)

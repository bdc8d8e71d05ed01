"""Invariants across paths and ranks: the paths agree, every rank built the same scenario."""

from __future__ import annotations

from cpsim.check.context import AllPaths
from cpsim.check.findings import Verdict, Violation, examples_at, flat_nonzero, rows_with_any, slot_text
from cpsim.check.invariants import Invariant


def paths_agree(every: AllPaths) -> list[Verdict]:
    """Each path that ran against the first: equal buffers where both judge a group (its rows enabled on
    every rank of both, and the profile has a rule for it on both), up to the profile's reach."""
    ctx, cases = every.ctx, every.cases  # a failed path has no case: it has no slots
    if len(cases) < 2:
        return [Verdict("paths-agree", "*", "n/a")]
    first = cases[0]
    base = first.path
    out = []
    for case in cases[1:]:
        other = case.path
        vios, checked = [], 0
        m = ctx.end(min(first.entries, case.entries))
        sa, sb = first.slots, case.slots
        both = (first.enabled & case.enabled).all(0).tolist() if sa.shape[0] == sb.shape[0] else []
        for gi, g in enumerate(ctx.s.groups):
            if gi >= len(both) or not both[gi] or first.groups[gi].unjudged or case.groups[gi].unjudged:
                continue
            a, b = sa[:, gi, :m], sb[:, gi, :m]
            checked += a.size
            differ = a != b
            count = int(differ.sum())
            if count:
                ranks = rows_with_any(differ)
                r = ranks[0]
                vios.append(Violation("paths-agree", f"{base}~{other}", g.name, count,
                                      f"{base} and {other} differ in {count} entr(ies)", ranks,
                                      examples_at(ctx, flat_nonzero(differ[r]), b[r],
                                                lambda t: f"{slot_text(int(a[r, t]))} ({base})", r)))
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


PATHS_AGREE = Invariant("paths-agree", "paths", paths_agree)
SAME_SCENARIO = Invariant("same-scenario", "paths", lambda every: [same_scenario(every.fingerprints)])

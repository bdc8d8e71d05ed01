"""Invariants across paths and ranks: the paths agree, every rank built the same scenario."""

from __future__ import annotations

from cpsim.check import profiles
from cpsim.check.findings import Verdict, Violation, _examples, _fmt, _np, _nz, _rows


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

"""The oracle: invariants of SPEC §4 over all-gathered slot mappings.

Pure functions of (scenario, allocation, gathered tensors). No processes, no I/O,
and no import of the kernels being judged: expected values come from
``cpsim.layout`` and ``cpsim.check.reference`` only. Everything is vectorised over
tokens and ranks, in numpy; Python loops run over paths and groups, and over the ranks or
replica sets that failed (to word their violations).

The invariants live in :mod:`cpsim.check.invariants`, one :class:`~cpsim.check.invariants.Invariant`
each; ``ORACLE`` lists them in the order their verdicts are reported, and ``check`` runs that list.
"""

from __future__ import annotations

import dataclasses

from cpsim.allocator import Allocation
from cpsim.check import profiles
from cpsim.check.context import AllPaths, GroupCase, PathCase, _Ctx  # noqa: F401 (_Ctx: tests build one)
from cpsim.check.findings import MAX_EXAMPLES, MISSING, Example, Verdict, Violation  # noqa: F401
from cpsim.check.invariants import Invariant, agreement, kernel, owners, host_sizing, slots
from cpsim.check.invariants.agreement import same_scenario  # noqa: F401
from cpsim.check.invariants.kernel import INPUT_NAMES, OUTPUT_FAULTS  # noqa: F401
from cpsim.check.invariants.host_sizing import block_sizing, capacity, sizing_waste  # noqa: F401
from cpsim.check.invariants.slots import no_collision  # noqa: F401
from cpsim.scenario import Scenario

# Every invariant, in the order a path's verdicts are reported; those across paths last.
ORACLE: tuple[Invariant, ...] = (
    kernel.KERNEL_COMPLETES,
    kernel.GUARD_INTACT,
    kernel.INPUTS_INTACT,
    kernel.KERNEL_OUTPUT,
    slots.ROW_BOUNDS,
    owners.EXACTLY_ONE_OWNER,
    owners.OWNER_RULE,
    owners.REPLICAS_AGREE,
    owners.DENSE_LOCAL,
    slots.NO_COLLISION,
    host_sizing.BLOCK_SIZING,
    host_sizing.CAPACITY,
    slots.PADDING,
    slots.REPLAYED_IS_PAD,
    slots.MATCHES_REFERENCE,
    agreement.PATHS_AGREE,
    agreement.SAME_SCENARIO,
)
INVARIANTS = tuple(inv.name for inv in ORACLE)
PER_PATH = tuple(inv for inv in ORACLE if inv.scope != "paths")
ACROSS_PATHS = tuple(inv for inv in ORACLE if inv.scope == "paths")


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
        Verdict(inv.name, path, "not run", note=why) for inv in PER_PATH if inv is not kernel.KERNEL_COMPLETES]


def not_run(path: str, reason: str) -> list[Verdict]:
    """Verdicts for a requested path that was not run, so every report states it."""
    return [Verdict(inv.name, path, "not run", note=reason) for inv in PER_PATH]


def check(s: Scenario, allocs_world: list[list[Allocation]], gathered: dict, fingerprints: list[str] | None = None,
          profile: "profiles.Profile | None" = None) -> list[Verdict]:
    """Every invariant for every gathered path; one Verdict per (invariant, path), judged by ``profile``
    (default: cpsim's model)."""
    s = profiles.scenario_for(s, profile or profiles.PROFILES["cpsim"])
    ctx = _Ctx(s, allocs_world, profile)
    verdicts: list[Verdict] = []
    cases: list[PathCase] = []
    earlier: dict[int, GroupCase] = {}  # group -> the last path's case that judged its buffer afresh
    for path, G in gathered.items():
        failures = getattr(G, "failures", None) or []
        if failures:
            verdicts += kernel_failed(path, failures[0], s.cp.world)
            continue
        case = PathCase(ctx, path, G, earlier)
        cases.append(case)
        verdicts += [_verdict(inv, case) for inv in PER_PATH]
    every = AllPaths(ctx, cases, fingerprints)
    for inv in ACROSS_PATHS:
        verdicts += inv.judge(every)
    return verdicts


def _verdict(inv: Invariant, case: PathCase) -> Verdict:
    """``inv``'s verdict on one path: judged over the path, or over each of its groups where it applies."""
    applies, checked, found = False, 0, []
    for c in (case,) if inv.scope == "path" else case.groups:
        if not inv.applies(c):
            continue
        applies = True
        checked += inv.count(c)
        if not inv.buffer_only:
            found += inv.judge(c)
        elif c.same_as is None:
            vios = c.found[inv.name] = inv.judge(c)
            found += vios
        elif vios := c.same_as.found[inv.name]:
            # The buffer an earlier path handed in (both paths right, or wrong alike): its violations, which
            # name no path but in ``Violation.path``: a quarter of the fuzz loop's check time.
            found += [dataclasses.replace(v, path=c.path) for v in vios]
    status = "n/a" if not applies else ("fail" if found else "pass")
    return Verdict(inv.name, case.path, status, checked, found)


def passed(verdicts: list[Verdict]) -> bool:
    return all(v.status != "fail" for v in verdicts)

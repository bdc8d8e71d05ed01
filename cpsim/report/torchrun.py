"""The report of a run under torchrun: one block per CP group on the console, and its JSON."""

from __future__ import annotations

import dataclasses

from cpsim.check import coordinator
from cpsim.report import report
from cpsim.run.distrun import GroupResult, RankInfo


def _signature(r: GroupResult) -> tuple:
    """What a CP group's report says, without where it ran: groups that agree print once."""
    return tuple((v.invariant, v.path, v.status, v.count, tuple((x.group, x.message) for x in v.violations))
                 for v in r.verdicts) + (tuple(r.skipped),)


def print_groups(console, results: list[GroupResult], subjects: dict | None = None, examples: int | None = None) -> None:
    """One report per distinct outcome: a CP group whose verdicts repeat an earlier group's gets one line."""
    seen: dict[tuple, GroupResult] = {}
    for r in results:
        sig = _signature(r)
        if sig in seen and r.scenario.fingerprint() == seen[sig].scenario.fingerprint():
            first = seen[sig]
            console.print(f"{r.label} · CP group {r.group} (ranks {r.ranks[0]}-{r.ranks[-1]}): same verdicts as "
                          f"CP group {first.group}", highlight=False, soft_wrap=True)
            continue
        seen[sig] = r
        title = (f"{r.label} · CP group {r.group} (ranks {r.ranks[0]}-{r.ranks[-1]}) · seed {r.scenario.seed} "
                 f"· scenario {r.scenario.fingerprint()}")
        report.print_report(console, r.scenario, r.verdicts, title=title, subjects=subjects,
                            examples=report.DEFAULT_EXAMPLES if examples is None else examples)
        for p in r.skipped:
            console.print(f"[dim]{p}: not applicable at CP world size {r.scenario.cp.world}[/dim]")


def to_dict(results: list[GroupResult], infos: list[RankInfo], extra: dict | None = None,
            subjects: dict | None = None, stopped: dict | None = None) -> dict:
    """The torchrun JSON; ``subjects`` names the kernel under test on each path; ``stopped`` (a run that
    ended early: ``{"message", "ranks"}``, see ``stopped_record``) makes it a failure whatever the groups
    finished so far say."""
    return {
        "schema_version": report.SCHEMA_VERSION,
        "mode": "torchrun",
        "world_size": len(infos),
        "passed": stopped is None and all(coordinator.passed(r.verdicts) for r in results),
        "ranks": [dataclasses.asdict(i) for i in infos],
        **({"subjects": subjects} if subjects is not None else {}),
        "groups": [report.to_dict(r.scenario, r.verdicts, {"label": r.label, "group": r.group, "ranks": r.ranks,
                                                           "paths_skipped": r.skipped}) for r in results],
        **({"stopped": stopped} if stopped is not None else {}),
        **(extra or {}),
    }


def stopped_record(message: str, ranks: list[int], world: int, done: int, planned: int) -> dict:
    """What the reports say of a torchrun job that stopped early: rank 0's stop line, the ranks it names
    as the cause, and how many of the planned entries every group finished."""
    return {"message": message, "ranks": sorted(ranks), "world_size": world, "entries_done": done,
            "entries_planned": planned}

"""The report of a run under torchrun: one block per CP group on the console, and its JSON."""

from __future__ import annotations

import dataclasses

from cpsim.check import coordinator
from cpsim.report import report
from cpsim.run.distrun import GroupResult, RankInfo


def print_groups(console, results: list[GroupResult]) -> None:
    for r in results:
        title = (f"{r.label} · CP group {r.group} (ranks {r.ranks[0]}-{r.ranks[-1]}) · seed {r.scenario.seed} "
                 f"· scenario {r.scenario.fingerprint()}")
        report.print_report(console, r.scenario, r.verdicts, title=title)
        for p in r.skipped:
            console.print(f"[dim]{p}: not applicable at CP world size {r.scenario.cp.world}[/dim]")


def to_dict(results: list[GroupResult], infos: list[RankInfo], extra: dict | None = None) -> dict:
    return {
        "schema_version": report.SCHEMA_VERSION,
        "mode": "torchrun",
        "world_size": len(infos),
        "passed": all(coordinator.passed(r.verdicts) for r in results),
        "ranks": [dataclasses.asdict(i) for i in infos],
        "groups": [report.to_dict(r.scenario, r.verdicts, {"label": r.label, "group": r.group, "ranks": r.ranks,
                                                           "paths_skipped": r.skipped}) for r in results],
        **(extra or {}),
    }

"""Turn verdicts into what people and machines read: a rich table, JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cpsim import __version__
from cpsim.check.coordinator import INVARIANTS, Verdict, passed
from cpsim.scenario import Scenario

SCHEMA_VERSION = 1


def to_dict(s: Scenario, verdicts: list[Verdict], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "cpsim_version": __version__,
        "scenario": s.to_dict(),
        "fingerprint": s.fingerprint(),
        "passed": passed(verdicts),
        "verdicts": [dataclasses.asdict(v) | {"count": v.count} for v in verdicts],
        **(extra or {}),
    }


def json_schema() -> dict[str, Any]:
    """The JSON Schema that ``to_dict`` output follows (docs/REPORT_SCHEMA.md)."""
    from importlib.resources import files
    return json.loads(files("cpsim.report").joinpath("report.schema.json").read_text())


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def _cell(v: Verdict | None) -> str:
    if v is None or v.status == "n/a":
        return "[dim]n/a[/dim]"
    if v.status == "not run":
        return "[yellow]not run[/yellow]"
    if v.status == "pass":
        return "[green]pass[/green]"
    return f"[bold red]FAIL {v.count}[/bold red]"


def table(verdicts: list[Verdict], title: str = "") -> Table:
    """Invariant x path grid; cross-path and whole-run invariants get their own column."""
    paths = [p for p in dict.fromkeys(v.path for v in verdicts) if p != "*" and "~" not in p]
    t = Table(title=title or None, show_lines=False)
    t.add_column("invariant", style="bold")
    for p in paths:
        t.add_column(p, justify="center")
    t.add_column("across", justify="center")
    by = {(v.invariant, v.path): v for v in verdicts}
    for inv in INVARIANTS:
        cross = inv in ("paths-agree", "same-scenario")
        row = [inv] + ["" if cross else _cell(by.get((inv, p))) for p in paths]
        across = [v for v in verdicts if v.invariant == inv and (v.path == "*" or "~" in v.path)]
        if across:
            worst = next((v for v in across if v.status == "fail"), across[0])
            row.append(_cell(worst) if worst.status != "fail" else
                       f"[bold red]FAIL {sum(v.count for v in across)}[/bold red]")
        else:
            row.append("")
        t.add_row(*row)
    return t


def print_report(console: Console, s: Scenario, verdicts: list[Verdict], title: str = "",
                 max_violations: int = 12) -> None:
    head = escape(title or f"scenario {s.name} [{s.fingerprint()}]")  # a fingerprint can read as markup
    console.print(f"[bold]{head}[/bold]: CP {s.cp.world} (DCP {s.cp.dcp} x PCP {s.cp.pcp}), "
                  f"interleave {s.cp.interleave}, {len(s.groups)} group(s), {s.batch.num_reqs} request(s), "
                  f"{s.batch.num_tokens} token(s)")
    console.print(table(verdicts))
    for path, note in dict.fromkeys((v.path, v.note) for v in verdicts if v.status == "not run"):
        console.print(f"[yellow]{escape(path)}: not run[/yellow] - {escape(note)}", highlight=False)
    shown = 0
    for v in verdicts:
        for vio in v.violations:
            if shown >= max_violations:
                break
            shown += 1
            ranks = f" ranks {vio.ranks}" if vio.ranks else ""
            console.print(f"[red]✗ {vio.invariant}[/red] {escape(f'[{vio.path}]')} group {vio.group}{ranks}: "
                          f"{escape(vio.message)}", highlight=False)
            for e in vio.examples:
                where = ", ".join(f"{k} {val}" for k, val in (("rank", e.rank), ("request", e.request),
                                                              ("position", e.position)) if val is not None)
                console.print(f"    {where}: expected {e.expected}, got {e.actual}", highlight=False)
    total = sum(len(v.violations) for v in verdicts)
    if total > shown:
        console.print(f"… {total - shown} more violation(s); see --json for all")
    console.print("[bold green]all invariants hold[/bold green]" if passed(verdicts)
                  else "[bold red]invariants violated[/bold red]")

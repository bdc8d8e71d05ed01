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
from cpsim.check.coordinator import INVARIANTS, Verdict, Violation, passed
from cpsim.report.terminal import DEFAULT_EXAMPLES, table_box
from cpsim.scenario import Scenario

SCHEMA_VERSION = 1


def to_dict(s: Scenario, verdicts: list[Verdict], extra: dict[str, Any] | None = None,
            subjects: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The JSON report; ``subjects`` names the kernel under test on each path (``cpsim.kernels.subject``)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "cpsim_version": __version__,
        "scenario": s.to_dict(),
        "fingerprint": s.fingerprint(),
        "passed": passed(verdicts),
        "verdicts": [dataclasses.asdict(v) | {"count": v.count} for v in verdicts],
        **({"subjects": subjects} if subjects is not None else {}),
        **(extra or {}),
    }


def json_schema() -> dict[str, Any]:
    """The JSON Schema that ``to_dict`` output follows (docs/REPORT_SCHEMA.md)."""
    from importlib.resources import files
    return json.loads(files("cpsim.report").joinpath("report.schema.json").read_text())


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def subject_line(sub: dict[str, Any]) -> str:
    """One kernel-under-test entry for people: ``builtin`` or ``SPEC (ABI)``, replay kernel, then the hashes."""
    def one(x: dict[str, Any]) -> str:
        return "builtin" if x.get("kind") == "builtin" else f"{x['spec']} ({x['abi']})"
    text = one(sub)
    replay = sub.get("replay")
    if replay:
        text += f" + replay padding {one(replay)}"
    hashes = [f"sha256 {sub['sha256']}"] if sub.get("sha256") else []
    if replay and replay.get("sha256"):
        hashes.append(f"replay sha256 {replay['sha256']}")
    return text + (f"; {', '.join(hashes)}" if hashes else "")


def kernels_heading(subjects: dict[str, dict[str, Any]] | None) -> list[str]:
    """Lines naming the kernel under test on each path (all built-in: one line)."""
    if not subjects:
        return []
    profile = next(iter(subjects.values())).get("profile", "cpsim")
    user = {p: sub for p, sub in subjects.items() if sub.get("kind") != "builtin" or sub.get("replay")}
    if not user:
        return [f"kernels: cpsim built-in on every path ({', '.join(subjects)}); profile {profile}"]
    rest = [p for p in subjects if p not in user]
    lines = [f"kernel under test on {p}: {subject_line(sub)}" + (f" file {sub['file']}" if sub.get("file") else "")
             for p, sub in user.items()]
    if rest:
        lines.append(f"built-in on {', '.join(rest)}; profile {profile}")
    return lines


def _cell(v: Verdict | None) -> str:
    if v is None or v.status == "n/a":
        return "[dim]n/a[/dim]"
    if v.status == "not run":
        return "[yellow]not run[/yellow]"
    if v.status == "pass":
        return "[green]pass[/green]"
    return f"[bold red]FAIL {v.count}[/bold red]"


def _header(path: str, subjects: dict[str, dict[str, Any]] | None) -> str:
    sub = (subjects or {}).get(path)
    if not sub or (sub.get("kind") == "builtin" and not sub.get("replay")):
        return path
    name = sub["spec"].rpartition(":")[2] if sub.get("kind") != "builtin" else "builtin"
    return f"{path}\n[dim]{escape(name)}{' +replay' if sub.get('replay') else ''}[/dim]"


def table(verdicts: list[Verdict], title: str = "", subjects: dict[str, dict[str, Any]] | None = None) -> Table:
    """Invariant x path grid; cross-path and whole-run invariants get their own column.

    A path whose kernel is the user's names it under the path in the header."""
    paths = [p for p in dict.fromkeys(v.path for v in verdicts) if p != "*" and "~" not in p]
    t = Table(title=title or None, show_lines=False, box=table_box())
    t.add_column("invariant", style="bold")
    for p in paths:
        t.add_column(_header(p, subjects), justify="center")
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


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" and {items[-1]}"


def agreeing(verdicts: list[Verdict]) -> list[tuple[str, list[str], list[Violation]]]:
    """(invariant, paths, violations) for every failing invariant, paths whose violations are the same
    (group, ranks, message and examples) merged into one entry, in INVARIANTS order."""
    def key(vio: Violation):
        return (vio.group, tuple(vio.ranks), vio.message, tuple(dataclasses.astuple(e) for e in vio.examples))

    out = []
    for inv in [*INVARIANTS, *dict.fromkeys(v.invariant for v in verdicts if v.invariant not in INVARIANTS)]:
        merged: dict[tuple, tuple[list[str], list[Violation]]] = {}
        for v in verdicts:
            if v.invariant != inv or not v.violations:
                continue
            sig = tuple(key(x) for x in v.violations)
            merged.setdefault(sig, ([], v.violations))[0].append(v.path)
        out += [(inv, paths, vios) for paths, vios in merged.values()]
    return out


def _where(e) -> str:
    return ", ".join(f"{k} {val}" for k, val in (("rank", e.rank), ("request", e.request),
                                                 ("position", e.position)) if val is not None) or "entry"


def ownership_table(rows) -> Table:
    """Owned positions per (path, group, request, rank): expected vs held (``check.ownership``)."""
    from cpsim.check.ownership import ranges
    t = Table(title="owned tokens per rank: expected (p // I) % N vs actually holding a slot", box=table_box())
    for col in ("path", "group", "request", "rank", "expected", "actual", "expected positions", "actual positions"):
        t.add_column(col, justify="right" if col in ("request", "rank", "expected", "actual") else "left")
    for o in rows:
        style = "" if o.expected == o.actual else "red"
        t.add_row(escape(o.path), escape(o.group), str(o.request), str(o.rank), str(len(o.expected)),
                  str(len(o.actual)), ranges(o.expected), ranges(o.actual), style=style)
    return t


def merged_ownership(rows) -> list[tuple[list[str], list]]:
    """Ownership rows of paths that agree, merged: [(paths, rows of the first)]."""
    by_path: dict[str, list] = {}
    for o in rows:
        by_path.setdefault(o.path, []).append(o)
    merged: dict[tuple, tuple[list[str], list]] = {}
    for path, rs in by_path.items():
        sig = tuple((o.group, o.request, o.rank, tuple(o.expected), tuple(o.actual)) for o in rs)
        merged.setdefault(sig, ([], rs))[0].append(path)
    return list(merged.values())


MAX_OWNERSHIP_ROWS = 32


def print_ownership(console: Console, rows, max_rows: int = MAX_OWNERSHIP_ROWS) -> None:
    shown = []
    for paths, rs in merged_ownership(rows):
        for o in rs:
            shown.append(dataclasses.replace(o, path=" = ".join(paths)))
    if not shown:
        return
    console.print(ownership_table(shown[:max_rows]))
    if len(shown) > max_rows:
        console.print(f"… {len(shown) - max_rows} more row(s); see --json")


def print_report(console: Console, s: Scenario, verdicts: list[Verdict], title: str = "",
                 examples: int = DEFAULT_EXAMPLES, subjects: dict[str, dict[str, Any]] | None = None,
                 gathered: dict | None = None) -> None:
    """The report people read: what ran, the grid, one line per failing invariant and agreeing paths,
    the per-rank ownership table (with ``gathered``), then at most ``examples`` examples per invariant."""
    head = escape(title or f"scenario {s.name} [{s.fingerprint()}]")  # a fingerprint can read as markup
    console.print(f"[bold]{head}[/bold]: CP {s.cp.world} (DCP {s.cp.dcp} x PCP {s.cp.pcp}), "
                  f"interleave {s.cp.interleave}, {len(s.groups)} group(s), {s.batch.num_reqs} request(s), "
                  f"{s.batch.num_tokens} token(s)", soft_wrap=True)
    for line in kernels_heading(subjects):
        console.print(escape(line), highlight=False, soft_wrap=True)
    console.print(table(verdicts, subjects=subjects))
    for path, note in dict.fromkeys((v.path, v.note) for v in verdicts if v.status == "not run"):
        console.print(f"[yellow]{escape(path)}: not run[/yellow] - {escape(note)}", highlight=False, soft_wrap=True)
    failing = agreeing(verdicts)
    for inv, paths, vios in failing:
        groups = ", ".join(dict.fromkeys(x.group for x in vios))
        more = f" (+{len(vios) - 1} more)" if len(vios) > 1 else ""
        same = " (same on each)" if len(paths) > 1 else ""
        console.print(f"[red]✗ {escape(inv)}[/red] {escape('[' + ', '.join(paths) + ']')} group {escape(groups)}"
                      f"{same}: {escape(vios[0].message)}{more}", highlight=False, soft_wrap=True)
    if gathered and failing:
        from cpsim.check.ownership import ownership
        print_ownership(console, ownership(s, gathered))
    left = 0
    for inv, paths, vios in failing:
        budget = examples
        for vio in vios:
            if budget <= 0:
                left += len(vio.examples) or 1
                continue
            ranks = f" ranks {vio.ranks}" if vio.ranks else ""
            where = f"{_and(paths)}: same {vio.count}" if len(paths) > 1 else paths[0]
            console.print(f"[red]{escape(inv)}[/red] {escape(f'[{where}]')} group {escape(vio.group)}{ranks}: "
                          f"{escape(vio.message)}", highlight=False, soft_wrap=True)
            budget -= 0 if vio.examples else 1
            for e in vio.examples:
                if budget <= 0:
                    left += 1
                    continue
                budget -= 1
                console.print(f"    {_where(e)}: expected {escape(str(e.expected))}, got {escape(str(e.actual))}",
                              highlight=False, soft_wrap=True)
    if left:
        console.print(f"… {left} more example(s) or violation(s) not shown (--examples N; --json has all)")
    console.print("[bold green]all invariants hold[/bold green]" if passed(verdicts)
                  else "[bold red]invariants violated[/bold red]")

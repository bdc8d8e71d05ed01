"""``cpsim replay FILE``: rerun a repro file and say whether the violation still shows."""

from __future__ import annotations

from rich.console import Console

from cpsim import fuzz as fz
from cpsim import report


def register(sub) -> None:
    p = sub.add_parser("replay", help="rerun a repro file written by `cpsim fuzz`")
    p.add_argument("file", metavar="FILE", help="repro-<fingerprint>.json")
    p.add_argument("--device", default="cpu", help="torch device for the kernels (default: cpu, Triton interpreter)")
    # HOOK(lead): `--torchrun` / launch/local.sh N replay FILE once torchrun support lands.
    p.add_argument("--json", metavar="FILE", help="write the report and the violation summary as JSON")
    p.add_argument("--quiet", action="store_true", help="print only the verdict line")
    p.set_defaults(func=main)


def main(args) -> int:
    r = fz.load_repro(args.file)
    console = Console()
    out = fz.replay(r, args.device)
    recorded = r.violation.get("invariants", [])
    now = out.invariants()
    if not args.quiet:
        if r.inject:
            console.print(f"injected fault: {r.inject}")
        if out.error:
            console.print(f"[red]error:[/red] {out.error}", highlight=False)
        else:
            report.print_report(console, r.scenario, out.verdicts)
    if args.json:
        report.write_json(args.json, report.to_dict(r.scenario, out.verdicts, {
            "inject": r.inject, "violation": out.summary(), "recorded_violation": r.violation}))
    if not out.failed:
        console.print(f"[green]violation no longer shows[/green] (recorded: {', '.join(recorded) or 'none'})")
        return 0
    same = "same as recorded" if now == recorded else f"recorded: {', '.join(recorded) or 'none'}"
    console.print(f"[bold red]violation reproduced[/bold red]: {', '.join(now)} ({same})", highlight=False)
    return 1

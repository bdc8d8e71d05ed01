"""``cpsim replay`` for captures and explicit batches: check every step, stop at the first that breaks.

Each unit (a step's per-group launches, or one multi-group launch) is checked
across ranks with the coordinator; with a kernel given, the captured inputs are
rerun through it and its outputs are checked too (and compared with the
captured ones: ``paths-agree``). The first failing unit is reported in full,
with one line naming step, rank, group and token; ``--shrink`` then writes the
smallest explicit batch that still fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from cpsim.report import terminal
from rich.markup import escape

from cpsim.capture import batch as xb
from cpsim.capture import shrink
from cpsim.capture.batch import ExplicitStep
from cpsim.capture.picture import write_html
from cpsim.capture.steps import check_step, first_finding, iter_steps
from cpsim.check import profiles
from cpsim.errors import ConfigError
from cpsim.kernels.under_test import load


def main(args, console: Console | None = None, runner=None) -> int:
    """The ``cpsim replay`` branch for captures and explicit batches; exit 0 clean, 1 a violation.
    ``runner``: the ``KernelRunner`` that reads and reruns a user's kernels (the command's; none: one of its own)."""
    from cpsim.run.runner import given
    with given(runner) as r:
        return _main(args, console, r)


def _main(args, console: Console | None, runner) -> int:
    import os

    from cpsim.report import report

    if "OMP_NUM_THREADS" not in os.environ:
        # One intra-op thread: on a shared 2-core box two threads made the 1M x 8 x 4 check 8x slower
        # (docs/BENCHMARKS.md, capture replay); OMP_NUM_THREADS overrides.
        import torch
        torch.set_num_threads(1)
    quiet_rank = os.environ.get("RANK", "0") not in ("", "0")  # under torchrun only rank 0 speaks
    console = console or terminal.console(quiet=quiet_rank)
    kernels = _kernels(args, runner)
    name = getattr(args, "profile", None)
    prof = profiles.get(name) if name else profiles.for_abis([getattr(k, "abi", "builtin") for k in kernels.values()])
    if not args.quiet:
        console.print(f"profile: {prof.name} ({prof.releases})", highlight=False, soft_wrap=True)
    checked = 0
    notes: list[str] = []
    for step in iter_steps(args.file, notes):
        out = check_step(step, kernels, profile=prof, runner=runner)
        checked += 1
        if out.differs:
            console.print(f"{escape(str(step.label.get('name', 'step')))}: the {step.path} kernel's outputs differ "
                          f"from the captured ones in {out.differs} entr(ies)", highlight=False)
        if not out.failed:
            continue
        title = f"{step.label.get('name') or 'explicit batch'} ({step.path}, {len(step.ranks)} ranks) — " \
                f"{Path(str(step.label.get('source', args.file))).name}"
        if not args.quiet:
            report.print_report(console, out.scenario, out.verdicts, title=title,
                                examples=getattr(args, "examples", report.DEFAULT_EXAMPLES), gathered=out.gathered)
            for note in step.notes:
                console.print(f"[dim]note: {escape(note)}[/dim]")
        finding = first_finding(step, out.gathered, out.verdicts)
        console.print(f"[bold red]{escape(finding.line(step))}[/bold red]", highlight=False)
        extra = {"capture": _label(step), "first_violation": finding.__dict__, "steps_checked": checked,
                 "profile": prof.name}
        if args.shrink and finding.invariant == "kernel-completes":
            console.print("not shrunk: the kernel did not complete, so there are no outputs to shrink", highlight=False)
        elif args.shrink:
            small, small_out = shrink.shrink(step, kernels, target=finding.invariant, runner=runner)
            dest = Path(args.shrink)
            xb.save(small, dest)
            r = small_out.step.ranks[0]
            console.print(f"shrunk to {r.num_reqs} request(s), {r.num_scheduled} token(s), "
                          f"{len(small_out.step.groups)} group(s): {', '.join(small_out.invariants())} "
                          f"still fails; written to {dest}", highlight=False)
            extra["shrunk"] = str(dest)
        if args.json:
            report.write_json(args.json, report.to_dict(out.scenario, out.verdicts, extra))
        if args.html:
            write_html(args.html, out, extra)
        return 1
    how = "rerun through " + ", ".join(f"{p}: {getattr(k, 'spec', k)}" for p, k in kernels.items()) \
        if kernels else "given outputs (steps without outputs: builtin kernel rerun)"
    if checked == 0:
        raise ConfigError("FILE", f"{args.file}: no complete step to check" + (f" ({notes[0]})" if notes else ""))
    for note in notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False)
    console.print(f"[bold green]{checked} step(s) checked ({escape(how)}); all invariants hold[/bold green]",
                  highlight=False)
    if args.json:
        report.write_json(args.json, {"passed": True, "steps_checked": checked, "profile": prof.name})
    return 0


def _label(step: ExplicitStep) -> dict[str, Any]:
    return {k: v for k, v in step.label.items() if k != "name"}


def _kernels(args, runner) -> dict:
    """The kernels a capture or explicit batch is rerun with. A user's is imported only in a worker of
    ``runner`` (this process learns its signature as plain data), and every rerun of it runs there too
    (``cpsim.capture.rerun``)."""
    if getattr(args, "kernel_v1_fused", None):
        raise ConfigError("--kernel-v1-fused", "captures and explicit batches rerun v1 and v2 kernels only")
    out = {}
    for path in ("v1", "v2"):
        spec = getattr(args, f"kernel_{path}", None)
        if spec in (None, ""):
            continue
        if spec == "builtin":
            out[path] = "builtin"
            continue
        out[path] = load(spec, path, getattr(args, "kernel_abi", "auto") or "auto", inspect=runner.probe,
                         shim_vllm=bool(getattr(args, "shim_vllm", False)))
    return out

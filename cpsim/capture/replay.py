"""``cpsim replay`` for captures and explicit batches: check every step, stop at the first that breaks.

Each unit (a step's per-group launches, or one multi-group launch) is checked
across ranks with the coordinator; with a kernel given, the captured inputs are
rerun through it and its outputs are checked too (and compared with the
captured ones: ``paths-agree``). The first failing unit is reported in full,
with one line naming step, rank, group and token; ``--shrink`` then writes the
smallest explicit batch that still fails.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from rich.console import Console
from rich.markup import escape

from cpsim.capture import batch as xb
from cpsim.capture.batch import ExplicitStep
from cpsim.check import coordinator, explicit
from cpsim.errors import ConfigError
from cpsim.layout import PAD_SLOT_ID


@dataclass
class Finding:
    """Where the first violation of a step is: what an engineer looks up first."""

    invariant: str
    path: str
    group: str
    rank: int | None
    token: int | None
    request: int | None
    position: int | None
    expected: str
    actual: str
    message: str

    def line(self, step: ExplicitStep) -> str:
        where = [f"step {step.label.get('step', 0)}", step.label.get("unit", step.path)]
        if self.rank is not None:
            where.append(f"rank {self.rank}")
            files = step.label.get("file_ranks")
            if files and files[self.rank] != self.rank:
                where.append(f"(file rank{files[self.rank]})")
        where.append(f"group {self.group}")
        if self.token is not None:
            where.append(f"token {self.token}")
        extra = ", ".join(f"{k} {v}" for k, v in (("request", self.request), ("position", self.position))
                          if v is not None)
        return (f"first violation: {self.invariant} [{self.path}] at {' '.join(where)}"
                f"{f' ({extra})' if extra else ''}: expected {self.expected}, got {self.actual}")


def _token(step: ExplicitStep, request: int | None, position: int | None) -> int | None:
    if request is None or position is None:
        return None
    rb = step.ranks[0]
    a, b = int(rb.query_start_loc[request]), int(rb.query_start_loc[request + 1])
    hit = np.nonzero(rb.positions[a:b] == position)[0]
    return a + int(hit[0]) if hit.size else None


def first_finding(step: ExplicitStep, gathered: dict, verdicts: list[coordinator.Verdict]) -> Finding | None:
    """The first violation that names a rank (the one to look at), else the first one.

    ``replicas-agree`` compares ranks with each other: a token-level violation of one rank,
    when there is one, says more, so it goes first."""
    vios = [vio for v in verdicts for vio in v.violations]
    named = [vio for vio in vios if vio.ranks or any(e.rank is not None for e in vio.examples)]
    named.sort(key=lambda vio: vio.invariant == "replicas-agree")
    for vio in named[:1] or vios[:1]:
        ex = vio.examples[0] if vio.examples else None
        rank = ex.rank if ex and ex.rank is not None else (vio.ranks[0] if vio.ranks else None)
        token = _token(step, ex.request, ex.position) if ex else None
        if token is None and vio.invariant == "padding" and rank is not None and vio.path in gathered:
            gi = [g.name for g in step.groups].index(vio.group)
            n = step.ranks[0].num_scheduled
            row = gathered[vio.path].slots[rank, gi, n:]
            bad = (row != PAD_SLOT_ID).nonzero().flatten()
            token = n + int(bad[0]) if len(bad) else None
        return Finding(vio.invariant, vio.path, vio.group, rank, token, ex.request if ex else None,
                       ex.position if ex else None, ex.expected if ex else "-", ex.actual if ex else "-",
                       vio.message)
    return None


@dataclass
class Outcome:
    step: ExplicitStep
    scenario: Any
    gathered: dict
    verdicts: list[coordinator.Verdict]
    differs: int | None = None   # entries where a rerun kernel's outputs differ from the captured ones

    @property
    def failed(self) -> bool:
        return not coordinator.passed(self.verdicts)

    def invariants(self) -> list[str]:
        return sorted({v.invariant for v in self.verdicts if v.status == "fail"})


def check_step(step: ExplicitStep, kernels: dict | None = None, device: str = "cpu") -> Outcome:
    """Check the given outputs; with a kernel for the step's path, rerun it and check its outputs too."""
    k = (kernels or {}).get(step.path)
    if k is None and step.has_outputs:
        s, gath, verdicts = explicit.check(step)
        return Outcome(step, s, gath, verdicts)
    from cpsim.capture import rerun
    slots = rerun.run(step, None if k in (None, "builtin") else k, device)
    given = [rb.slots for rb in step.ranks]
    plain = dataclasses.replace(step, ranks=[dataclasses.replace(rb, slots=None) for rb in step.ranks])
    s, gath, verdicts = explicit.check(plain, {f"rerun-{step.path}": slots})
    differs = None
    if step.has_outputs:
        differs = sum(int((a[:, : b.shape[1]] != b[:, : a.shape[1]]).sum()) for a, b in zip(given, slots))
    return Outcome(step, s, gath, verdicts, differs)


def iter_steps(path: str | Path, notes: list[str] | None = None) -> Iterator[ExplicitStep]:
    from cpsim.capture import load
    if xb.is_explicit(path):
        yield xb.load(path)
        return
    if load.is_capture(path):
        yield from load.steps(path, notes)
        return
    raise ConfigError("FILE", f"{path} is neither a capture (directory of rank*.cpcap or one .cpcap) nor an "
                              f"explicit batch ({xb.FORMAT} .npz/.json)")


def is_replayable(path: str | Path) -> bool:
    from cpsim.capture import load
    return load.is_capture(path) or xb.is_explicit(path)


def main(args, console: Console | None = None) -> int:
    """The ``cpsim replay`` branch for captures and explicit batches; exit 0 clean, 1 a violation."""
    import os

    from cpsim.report import report

    if "OMP_NUM_THREADS" not in os.environ:
        # One intra-op thread: on a shared 2-core box two threads made the 1M x 8 x 4 check 8x slower
        # (docs/BENCHMARKS.md, capture replay); OMP_NUM_THREADS overrides.
        import torch
        torch.set_num_threads(1)
    quiet_rank = os.environ.get("RANK", "0") not in ("", "0")  # under torchrun only rank 0 speaks
    console = console or Console(quiet=quiet_rank)
    kernels = _kernels(args)
    checked = 0
    notes: list[str] = []
    for step in iter_steps(args.file, notes):
        out = check_step(step, kernels)
        checked += 1
        if out.differs:
            console.print(f"{escape(str(step.label.get('name', 'step')))}: the {step.path} kernel's outputs differ "
                          f"from the captured ones in {out.differs} entr(ies)", highlight=False)
        if not out.failed:
            continue
        title = f"{step.label.get('name') or 'explicit batch'} ({step.path}, {len(step.ranks)} ranks) — " \
                f"{Path(str(step.label.get('source', args.file))).name}"
        if not args.quiet:
            report.print_report(console, out.scenario, out.verdicts, title=title)
            for note in step.label.get("notes", []):
                console.print(f"[dim]note: {escape(note)}[/dim]")
        finding = first_finding(step, out.gathered, out.verdicts)
        console.print(f"[bold red]{escape(finding.line(step))}[/bold red]", highlight=False)
        extra = {"capture": _label(step), "first_violation": finding.__dict__, "steps_checked": checked}
        if args.shrink:
            from cpsim.capture import shrink
            small, small_out = shrink.shrink(step, kernels, target=finding.invariant)
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
            from cpsim.capture.picture import write_html
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
        report.write_json(args.json, {"passed": True, "steps_checked": checked})
    return 0


def _label(step: ExplicitStep) -> dict[str, Any]:
    return {k: v for k, v in step.label.items() if k != "name"}


def _kernels(args) -> dict:
    from cpsim.kernels.under_test import load
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
        out[path] = load(spec, path, getattr(args, "kernel_abi", "auto") or "auto",
                         shim_vllm=bool(getattr(args, "shim_vllm", False)))
    return out

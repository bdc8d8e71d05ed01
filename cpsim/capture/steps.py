"""Checking a capture's or an explicit batch's steps: each step's verdicts, and the first finding
named down to step, rank, group and token (what ``cpsim replay``, the picture and the shrinker share)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from cpsim.capture import batch as xb
from cpsim.capture import load
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
        what = (f"expected {self.expected}, got {self.actual}" if (self.expected, self.actual) != ("-", "-")
                else self.message)  # a violation with no example (a table too narrow): its own line says it
        return (f"first violation: {self.invariant} [{self.path}] at {' '.join(where)}"
                f"{f' ({extra})' if extra else ''}: {what}")


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


def check_step(step: ExplicitStep, kernels: dict | None = None, device: str = "cpu", profile=None,
               runner=None) -> Outcome:
    """Check the given outputs; with a kernel for the step's path, rerun it and check its outputs too.
    ``profile``: the release profile judging (``cpsim.check.profiles``; None: cpsim's model); ``runner``:
    the rerun's (``cpsim.capture.rerun.run``)."""
    k = (kernels or {}).get(step.path)
    if k is None and step.has_outputs:
        s, gath, verdicts = explicit.check(step, profile=profile)
        return Outcome(step, s, gath, verdicts)
    from cpsim.capture import rerun
    from cpsim.run.isolation import KernelFailed
    try:
        out = rerun.run(step, None if k in (None, "builtin") else k, device, runner)
    except KernelFailed as e:  # the kernel's import or a rank's rerun did not complete: that is its verdict
        s, gath, verdicts = explicit.check(step) if step.has_outputs else (explicit.scenario(step), {}, [])
        return Outcome(step, s, gath, verdicts + coordinator.kernel_failed(f"rerun-{step.path}", e.failure,
                                                                          len(step.ranks)))
    given = [rb.slots for rb in step.ranks]
    plain = dataclasses.replace(step, ranks=[dataclasses.replace(rb, slots=None) for rb in step.ranks])
    name = f"rerun-{step.path}"
    s, gath, verdicts = explicit.check(plain, {name: out.slots}, profile,
                                       written=None if out.written is None else {name: out.written})
    differs = None
    if step.has_outputs:
        differs = sum(int((a[:, : b.shape[1]] != b[:, : a.shape[1]]).sum()) for a, b in zip(given, out.slots))
    return Outcome(step, s, gath, verdicts, differs)


def iter_steps(path: str | Path, notes: list[str] | None = None) -> Iterator[ExplicitStep]:
    if xb.is_explicit(path):
        yield xb.load(path)
        return
    if load.is_capture(path):
        yield from load.steps(path, notes)
        return
    raise ConfigError("FILE", f"{path} is neither a capture (directory of rank*.cpcap or one .cpcap) nor an "
                              f"explicit batch ({xb.FORMAT} .npz/.json)")


def is_replayable(path: str | Path) -> bool:
    return load.is_capture(path) or xb.is_explicit(path)

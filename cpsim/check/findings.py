"""What the oracle says: verdicts, their violations and examples, and the helpers that word them.

Shared by the invariants (:mod:`cpsim.check.invariants`) and the coordinator that runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cpsim.layout import PAD_SLOT_ID, POISON


MISSING = POISON  # also marks tokens a short buffer could not hold
MAX_EXAMPLES = 5


@dataclass
class Example:
    rank: int | None
    request: int | None
    position: int | None
    expected: str
    actual: str


@dataclass
class Violation:
    invariant: str
    path: str
    group: str
    count: int
    message: str
    ranks: list[int] = field(default_factory=list)
    examples: list[Example] = field(default_factory=list)


@dataclass
class Verdict:
    invariant: str
    path: str
    status: str                  # "pass" | "fail" | "n/a" | "not run"
    checked: int = 0             # entries or items examined
    violations: list[Violation] = field(default_factory=list)
    note: str = ""               # why a verdict is "not run"

    @property
    def count(self) -> int:
        return sum(v.count for v in self.violations)


def examples_at(ctx, idx, actual, expected, rank: int | None, show=None) -> list[Example]:
    """The first ``MAX_EXAMPLES`` of tokens ``idx`` as examples: the token's request and position (from the
    check's ``ctx``), ``expected`` (text, or a function of the token) and the slot ``actual`` holds."""
    out = []
    for t in np.asarray(idx)[:MAX_EXAMPLES].tolist():
        exp = expected(t) if callable(expected) else expected
        got = show(int(actual[t])) if show else slot_text(int(actual[t]))
        out.append(Example(rank, int(ctx.req[t]) if t < ctx.n else None, int(ctx.pos[t]) if t < ctx.n else None,
                           str(exp), got))
    return out


def slot_text(v: int) -> str:
    """A slot as a report shows it: PAD and the poison by name."""
    return {PAD_SLOT_ID: "PAD", MISSING: "unwritten"}.get(v, str(v))


def scheduled_entries(ctx, slots: np.ndarray) -> np.ndarray:
    """[ranks, n] scheduled-token entries; tokens past a short buffer read as MISSING."""
    r, t = slots.shape
    if t >= ctx.n:
        return slots[:, : ctx.n]
    return np.concatenate([slots, np.full((r, ctx.n - t), MISSING, dtype=slots.dtype)], 1)


def is_real(x: np.ndarray) -> np.ndarray:
    """Entries holding a slot: neither PAD nor left unwritten."""
    return (x != PAD_SLOT_ID) & (x != MISSING)


def host_array(x) -> np.ndarray:
    """A gathered tensor (torch, on any device) as a host numpy array. A host tensor outside autograd (what
    the virtual world gathers) is viewed as it is: ``detach().cpu()`` cost more than the view, for every
    field of every path of every fuzz scenario."""
    if not hasattr(x, "detach"):
        return np.asarray(x)
    try:
        return x.numpy()
    except (RuntimeError, TypeError):  # on a device, or needing grad: the way round
        return x.detach().cpu().numpy()


def flat_nonzero(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(mask)`` through the array's own methods (no dispatch wrappers: called ~20 times a check)."""
    return np.asanyarray(mask).ravel().nonzero()[0]


def rows_with_any(mask: np.ndarray) -> list[int]:
    """Indices of the rows of a [rows, n] mask with any entry set."""
    return mask.any(1).nonzero()[0].tolist()

"""Signatures: which distinct bug a failure is (path, group kind, failed invariants, the dimension
whose removal cures it), and the patterns ``--ignore`` / ``--known`` match them by."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cpsim import scenario as sc
from cpsim.errors import ConfigError
from cpsim.fuzz.repro import Outcome, size, size_key


@dataclass(frozen=True)
class Dimension:
    """A scenario feature a bug can need. ``ablate`` returns the same scenario without it
    (None when it cannot be removed), so a failure that disappears with it is put on it.
    Add new ones to DIMENSIONS (e.g. "partial-replica" with per-group CP sizes)."""

    name: str
    describe: str
    present: Callable[[sc.Scenario], bool]
    ablate: Callable[[sc.Scenario], "sc.Scenario | None"]


def _clamp_caches(s: sc.Scenario, most: Callable[[sc.KVGroup], int]) -> sc.Scenario | None:
    """``s`` with each group's cache cut to ``most(g)`` blocks; None if the batch no longer fits."""
    groups = []
    for g in s.groups:
        n = min(g.num_blocks, most(g))
        if n < max(2, sc.max_blocks_needed(s, g) + 1):
            return None
        groups.append(dataclasses.replace(g, num_blocks=n))
    return s.replace(groups=tuple(groups))


def _unpadded(s: sc.Scenario) -> sc.Scenario:
    return s.replace(batch=dataclasses.replace(s.batch, num_tokens_padded=0))


# Removed in this order, cumulatively: a failure is put on the first whose removal cures it.
# "slot>=2^31" comes before "block-id>2^24": cutting slots below 2^31 keeps ids as large as
# int32 slots allow, so an int32 slot overflow is always put on slots. The reverse does not hold
# for block sizes >= 128, where no id past 2^24 survives the slot cut: in the extreme space a
# float32 gather can be reported under "slot>=2^31" too (the default space's caches with slots
# past 2^31 hold no kernel-block id past 2^24, so there it cannot).
DIMENSIONS: list[Dimension] = [
    Dimension("padded-tail", "graph padding past the scheduled tokens",
              lambda s: s.batch.num_tokens_padded > s.batch.num_tokens, _unpadded),
    # Any group, not only cpsim's slot-mapped ones: the vLLM profiles give state (mamba) groups slots.
    Dimension("slot>=2^31", "slot ids at or past 2^31 (int32 slot arithmetic / tensors)",
              lambda s: any(g.num_blocks * g.block_size > 2**31 for g in s.groups),
              lambda s: _clamp_caches(s, lambda g: 2**31 // g.block_size)),
    Dimension("block-id>2^24", "kernel-block ids past 2^24 (not exact in float32)",
              lambda s: any(g.slot_mapped and g.num_blocks * g.bpk - 1 > 2**24 for g in s.groups),
              lambda s: _clamp_caches(s, lambda g: (2**24 + 1) // g.bpk)),
    Dimension("replay", "prefix-cache replay (replayed positions PAD in the prefix-cacheable groups)",
              lambda s: s.batch.has_replay,
              lambda s: s.replace(batch=dataclasses.replace(s.batch, requests=tuple(
                  dataclasses.replace(r, replay_start=0) for r in s.batch.requests)))),
    Dimension("slot-buffer-dtype", "a slot buffer of a dtype the kernel's ABI does not name (limits.slot_buffer_dtype)",
              lambda s: s.limits.slot_buffer_dtype != "abi",
              lambda s: s.replace(limits=dataclasses.replace(s.limits, slot_buffer_dtype="abi"))),
]
ANY_DIMENSION = "any"


def _ablation_order(s: sc.Scenario) -> list[Dimension]:
    """The dimensions present in ``s``, in DIMENSIONS order."""
    return [d for d in DIMENSIONS if d.present(s)]


def group_kind(s: sc.Scenario, name: str) -> str:
    for g in s.groups:
        if g.name == name:
            return g.kind
    return "*"


def components(out: "Outcome") -> dict[tuple[str, str], set[str]]:
    """(path, group name) -> failed invariants: the units a failure is split into."""
    comps: dict[tuple[str, str], set[str]] = {}
    for v in out.verdicts:
        if v.status != "fail":
            continue
        for g in sorted({x.group for x in v.violations} or {"*"}):
            comps.setdefault((v.path, g), set()).add(v.invariant)
    if out.error:
        comps.setdefault(("*", "*"), set()).add("error-" + out.error.split(":", 1)[0])
    return comps


def _triples(out: "Outcome") -> set[tuple[str, str, str]]:
    return {(p, g, i) for (p, g), invs in components(out).items() for i in invs}


# Invariants any wrong value also fails: left out of a signature when a more specific one failed,
# so one bug reads the same whether or not another bug shares its scenario.
GENERIC_INVARIANTS = ("matches-reference", "paths-agree")


def signature_invariants(invs) -> set[str]:
    specific = set(invs) - set(GENERIC_INVARIANTS)
    return specific or set(invs)


def signature_parts(sig: str) -> tuple[str, str, frozenset, str]:
    path, kind, invs, dim = sig.split(":")
    return path, kind, frozenset(invs.split("+")), dim


def merge_nested(findings: list["Finding"]) -> list["Finding"]:
    """Findings of one path, group kind and dimension whose invariant sets nest (one a subset of
    the other) are one bug seen with more or fewer side effects: keep the first seen, with the
    smaller scenario; the other signatures are listed in ``also``."""
    kept: list[Finding] = []
    for f in sorted(findings, key=lambda f: (f.ignored, f.first_seen, f.signature)):
        p, k, inv, d = signature_parts(f.signature)
        for m in kept:
            mp, mk, minv, md = signature_parts(m.signature)
            if (mp, mk, md, m.ignored) == (p, k, d, f.ignored) and (inv <= minv or minv <= inv):
                if size_key(f.scenario) < size_key(m.scenario):
                    m.scenario, m.summary = f.scenario, f.summary
                m.shrunk = m.shrunk or f.shrunk
                m.also = sorted(set(m.also) | {f.signature} | set(f.also))
                break
        else:
            kept.append(f)
    return kept


def signature_text(path: str, kind: str, invariants, dimension: str) -> str:
    """``path:group kind:invariant+invariant:dimension``, what --ignore / --known match (globs allowed)."""
    return f"{path}:{kind}:{'+'.join(sorted(invariants))}:{dimension}"


def matches(sig: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(sig, p) for p in patterns)


def load_known(path: str | Path) -> list[str]:
    """Signatures (or globs) from a text file, one a line (# comments), or a fuzz-summary.json."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("--known", f"cannot read {path}: {e}") from None
    if path.suffix == ".json" or text.lstrip()[:1] in ("{", "["):  # JSON by name or by content: a summary
        try:
            data = json.loads(text)
            return [str(x["signature"]) for x in data["signatures"]]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConfigError("--known", f"{path} is not a fuzz summary (expected {{\"signatures\": "
                                         f"[{{\"signature\": ...}}]}}): {e}") from None
    lines = [(n, ln.strip()) for n, ln in enumerate(text.splitlines(), 1) if ln.strip() and not ln.lstrip().startswith("#")]
    for n, line in lines:
        if ":" not in line or "\x00" in line:  # every signature is path:kind:invariants:dimension
            raise ConfigError("--known", f"{path} line {n} ({line[:40]!r}) is not a signature (path:kind:invariants:"
                                         f"dimension, globs allowed) and the file is not a fuzz-summary.json")
    return [line for _, line in lines]


@dataclass
class Finding:
    """One signature: where it was first seen and the smallest scenario that shows it."""

    signature: str
    first_seen: int                  # scenarios run before it showed (in its job)
    scenario: sc.Scenario
    summary: dict[str, Any]          # Outcome.summary() of ``scenario``
    dimension: str
    job: int = 0
    shrunk: bool = False             # Hypothesis shrank it (else: the smallest seen on the way)
    ignored: bool = False
    repro: Path | None = None
    repro_error: str = ""
    also: list[str] = field(default_factory=list)   # nested signatures merged into this one

    def to_dict(self) -> dict[str, Any]:
        return {"signature": self.signature, "first_seen": self.first_seen, "job": self.job,
                "dimension": self.dimension, "size": size(self.scenario), "shrunk": self.shrunk,
                "ignored": self.ignored, "invariants": self.summary.get("invariants", []), "also": self.also,
                "repro": str(self.repro) if self.repro else None, "repro_error": self.repro_error or None}

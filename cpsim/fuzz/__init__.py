"""Search the scenario space for every distinct violation, shrink each, hand them over as files.

Scenarios come from one space (``space``), valid by construction (``scenario.validate``
accepts every one of them unless ``allow_invalid`` asks for broken CP layouts), drawn by plain
random draws (``explore``, the default) or by Hypothesis; they run in the virtual world and the
coordinator judges them. Failures are
grouped by a *signature* (path, group kind, failed invariants, triggering
dimension); each signature is shrunk on its own and written as a repro file that
``cpsim replay`` (or any cpsim, on any machine) reruns.

Sizes are kept small on purpose: the Triton interpreter runs one program per
request per group per rank per path, at a few milliseconds each, so the space
spends its budget on *positions* and *cache sizes* (where the int32 / float32 /
window limits live) rather than on token counts.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cpsim import __version__
from cpsim.check import coordinator, profiles
from cpsim import scenario as sc
from cpsim.errors import ConfigError, Interrupted
from cpsim.kernels.under_test import ABIS, to_record
from cpsim.paths import Knobs
from cpsim.fuzz import explore as _explore
from cpsim.fuzz.rounds import (SEED_STRIDE, SignatureFailure, _failure_type, _hypothesis,  # noqa: F401  (re-exported)
                               database_of, hypothesis_round, scenarios, strategy_of)

REPRO_SCHEMA = "cpsim-repro/1"
DEFAULT_DB = Path(".cpsim") / "hypothesis"
DEFAULT_PATHS = ("v1", "v2")

# The spaces searched (``space.cache_cap``). "default": every kernel-block id < 2^26 (num_blocks * BPK <= 2^26), so ids past 2^24 (where float32 goes wrong)
# are reached with block sizes up to 64; slot ids < 2^31 (num_blocks * B <= 2^31) where a kernel
# under test writes int32 slots (its ABI's ``out_dtype``), else also caches of 2^24 kernel blocks
# whatever the block size (slots past 2^31 with kernel blocks of more than 128 tokens).
# "extreme" adds integer-boundary caches: up to 2^31 - 1 kernel blocks, slots far past 2^31.
SPACES = {
    "default": "realistic caches: kernel-block ids up to 2^26; slot ids past 2^31 with int64 slot outputs",
    "extreme": "integer-boundary caches: kernel-block ids up to 2^31 - 1, slots past 2^31",
}
INT32_SPACE = "realistic caches: kernel-block ids up to 2^26, every slot id < 2^31 (a kernel writes int32 slots)"


# ---- fault names -------------------------------------------------------------

def fault_names() -> list[str]:
    from cpsim import faults
    return faults.names()


def resolve_fault(name: str | None):
    """The injection of a catalogue fault by name: a function of the scenario (``None`` = no fault).

    Some injections depend on the scenario (the old MTP buffer formula), so the
    knobs are derived per scenario through the catalogue's ``knobs_for``.
    """
    if not name:
        return lambda s: Knobs()
    from cpsim import faults
    return faults.get(name, "--inject").knobs_for


def knobs_for_scenario(knobs, s: sc.Scenario) -> Knobs:
    """``knobs`` as given, or derived from the scenario when it is a fault's ``knobs_for``."""
    return knobs(s) if callable(knobs) else knobs


def sized(knobs, sizer, paths: list[str]):
    """``knobs`` (or a fault's ``knobs_for``) with what the sizing function under test (a
    ``cpsim.run.sizing.Sizer``; None: cpsim's own sizing) gives each host of the scenario. Its
    failure (``SizingFailure``) is raised where the knobs are asked for: ``evaluate``'s outcome."""
    if sizer is None:
        return knobs
    return lambda s: dataclasses.replace(knobs_for_scenario(knobs, s), host_sizing=sizer.answer(s, paths))


# ---- how big a scenario is (the strategy itself: cpsim.fuzz.rounds) ----------

def size(s: sc.Scenario) -> dict[str, int]:
    """What a shrunk scenario is measured by."""
    return {"world": s.cp.world, "groups": len(s.groups), "requests": s.batch.num_reqs,
            "tokens": s.batch.num_tokens}


def size_key(s: sc.Scenario) -> tuple:
    """Smaller is simpler: structure first, then magnitudes (cache sizes, positions, padding)."""
    b = s.batch
    return (b.num_reqs, b.num_tokens, len(s.groups), s.cp.world, b.num_tokens_padded,
            sum(g.num_blocks for g in s.groups), sum(r.context_len for r in b.requests),
            s.limits.max_model_len, s.canonical_json())


# ---- one evaluation ------------------------------------------------------------

@dataclass
class Outcome:
    """What one scenario did: failing (invariant, path) pairs and their messages."""

    verdicts: list[coordinator.Verdict]
    error: str = ""
    gathered: dict = field(default_factory=dict, repr=False)  # path -> world.Gathered (for pictures)
    not_expressible: str = ""  # the profile's release cannot run this scenario (not judged, not a pass)

    @property
    def failed(self) -> bool:
        return bool(self.error) or not coordinator.passed(self.verdicts)

    def invariants(self) -> list[str]:
        names = sorted({v.invariant for v in self.verdicts if v.status == "fail"})
        return names + (["error"] if self.error else [])

    def summary(self) -> dict[str, Any]:
        fails = [{"invariant": v.invariant, "path": v.path, "count": v.count,
                  "messages": [f"group {x.group}: {x.message}" for x in v.violations[:5]]}
                 for v in self.verdicts if v.status == "fail"]
        return {"invariants": self.invariants(), "failures": fails, "error": self.error}


def profiled(s: sc.Scenario, profile) -> tuple[sc.Scenario | None, str]:
    """``s`` as ``profile``'s runtime lays it out (``profiles.scenario_for``), or (None, why) where that
    release cannot express it."""
    if profile is None:
        return s, ""
    try:
        return profiles.scenario_for(s, profile), ""
    except ConfigError as e:
        return None, str(e)


def evaluate(s: sc.Scenario, paths: list[str], knobs: Knobs = Knobs(), device: str = "cpu",
             kernels: dict | None = None, allocs: list | None = None,
             meanwhile: Callable[[], None] | None = None, profile=None) -> Outcome:
    """Run the virtual world and the coordinator; an exception is an outcome too.

    ``kernels`` maps a path to the user's kernel (``cpsim.kernels.under_test``) replacing the
    built-in one; ``allocs`` is ``allocate_world(s)`` when the caller has it; ``meanwhile`` is called
    once, before the kernels' results are awaited (fuzz draws the next scenario there and queues its
    kernels behind these). ``profile``: the release profile judging (``cpsim.check.profiles``); a
    scenario its release cannot express is an outcome of its own, neither pass nor failure."""
    from cpsim.allocator import allocate_world
    from cpsim.run.world import run_virtual

    t, why = profiled(s, profile)
    if t is None or t is not s:
        allocs = None  # drawn for the scenario before the profile laid it out
    if t is None:
        if meanwhile is not None:
            meanwhile()
        return Outcome([], not_expressible=why)
    s = t
    try:
        knobs = knobs_for_scenario(knobs, s)  # a sizing function under test that fails: this scenario's failure
        allocs = allocs if allocs is not None else allocate_world(s)
    except ConfigError:
        raise
    except Exception as e:  # a crash in a path is a finding, shrunk like any other
        return Outcome([], f"{type(e).__name__}: {e}"[:2000])
    if meanwhile is not None:  # outside the try: nothing it does is this scenario's outcome
        meanwhile()
    try:
        gathered = run_virtual(s, paths, knobs, device=device, kernels=kernels, allocs=allocs)
    except ConfigError:
        raise
    except Exception as e:  # a crash in a path is a finding, shrunk like any other
        return Outcome([], f"{type(e).__name__}: {e}"[:2000])
    try:
        verdicts = coordinator.check(s, allocs, gathered, [s.fingerprint()] * s.cp.world, profile)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001  (as above)
        return Outcome([], f"{type(e).__name__}: {e}"[:2000])
    return Outcome(verdicts, gathered=gathered)


# ---- repro files ---------------------------------------------------------------

@dataclass
class Repro:
    scenario: sc.Scenario
    paths: list[str]
    knobs: Knobs
    inject: str | None
    violation: dict[str, Any]
    # path -> "builtin" or {spec, abi, v2_launch, shim_vllm} (kernel_under_test.to_record); empty = all built-in
    kernels: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    profile: str = ""  # the release profile that judged it ("" = the one the kernels imply)
    sizing: str = ""   # the --sizing SPEC it was found with ("" = cpsim's own sizing)


def write_repro(out_dir: str | Path, r: Repro) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"repro-{r.scenario.fingerprint()}.json"
    data = {
        "schema": REPRO_SCHEMA,
        "cpsim_version": __version__,
        "fingerprint": r.scenario.fingerprint(),
        "scenario": r.scenario.to_dict(),
        "paths": list(r.paths),
        "kernels": r.kernels or to_record({}, r.paths),
        "profile": r.profile,
        **({"sizing": r.sizing} if r.sizing else {}),
        "inject": r.inject,
        "knobs": dataclasses.asdict(r.knobs),
        "violation": r.violation,
        "size": size(r.scenario),
        **r.extra,
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def load_repro(path: str | Path) -> Repro:
    path = Path(path)
    if not path.exists():
        raise ConfigError("FILE", f"repro file {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError("FILE", f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("schema") != REPRO_SCHEMA:
        raise ConfigError("FILE", f"{path} is not a cpsim repro file (schema {REPRO_SCHEMA!r} expected)")
    try:
        knobs = Knobs(**data.get("knobs", {}))
    except TypeError as e:
        raise ConfigError("knobs", f"unknown knob in {path}: {e}") from None
    kernels = data.get("kernels") or {}
    if not isinstance(kernels, dict):
        raise ConfigError("kernels", f"{path}: expected {{path: 'builtin' | {{spec, abi, ...}}}}, got {kernels!r}")
    s = sc.validate(sc.Scenario.from_dict(data["scenario"]))
    profile = data.get("profile") or ""
    if profile:
        profiles.get(profile)  # a name this cpsim does not know is exit 2 here, not at the check
    sizing = data.get("sizing") or ""  # checked where it is run (``cpsim.run.sizing.Sizer``, field repro.sizing)
    return Repro(s, list(data.get("paths") or DEFAULT_PATHS), knobs, data.get("inject"),
                 data.get("violation", {}), kernels, profile=profile, sizing=sizing)


# ---- signatures: which distinct bug a failure is ------------------------------------

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


def check_db_dir(db: str | Path) -> Path:
    """The example database's directory: absent (created later) or a directory, never a file."""
    db = Path(db)
    for p in (db, *db.parents):
        if p.exists() and not p.is_dir():
            raise ConfigError("--db", f"{db} is not a directory ({p} is a file); give a directory for the "
                                      f"example database, or --no-db")
        if p.exists():
            break
    return db


# ---- the search ------------------------------------------------------------------

EXPLORERS = ("random", "hypothesis")

@dataclass
class FuzzConfig:
    paths: list[str] = field(default_factory=lambda: list(DEFAULT_PATHS))
    inject: str | None = None
    knobs: Knobs | None = None           # overrides ``inject``'s knobs when given
    max_examples: int = 300              # scenarios run (search and shrink), all jobs together
    minutes: float | None = None         # keep searching (in rounds) until this much time has passed
    seed: int | None = 0                 # None: random, and the example database is used
    allow_invalid: bool = False
    out: Path = Path("out")
    database: Path | None = DEFAULT_DB   # None: no example database; else keyed per configuration below it
    max_programs: int = 48
    max_tokens_per_request: int = 24
    shrink_seconds: float = 60.0         # per round; then stop shrinking and keep the smallest failure so far
    device: str = "cpu"
    kernels: dict = field(default_factory=dict)  # path -> KernelUnderTest replacing the built-in kernel
    space: str = "default"
    stop_after_first: bool = False
    ignore: list[str] = field(default_factory=list)  # signatures / globs not to report
    jobs: int = 1
    seed_stream: int = 0                 # this process's stream (job index; rank * jobs + job under torchrun)
    summary_name: str = "fuzz-summary.json"  # per rank under torchrun, so ranks sharing --out do not clash
    explore: str = "random"              # "random": plain random draws, Hypothesis shrinks (cpsim.fuzz.explore); "hypothesis"
    profile: str = ""                    # release profile judging ("" = the one the kernels imply)
    sizing: str = ""                     # --sizing SPEC under test ("" = cpsim's own host sizing)
    sizing_timeout: float = 60.0         # bound on one scenario's answer from the sizing function

    def judged_by(self):
        """The ``profiles.Profile`` the oracle judges by: the named one, else the kernels' release."""
        return (profiles.get(self.profile) if self.profile else
                profiles.for_abis([k.abi for k in (self.kernels or {}).values()]))

    def config_key(self) -> str:
        """Hash of what decides which scenarios fail: the example database is kept per key."""
        knobs = self.knobs if self.knobs is not None else None
        data = {"paths": self.paths, "kernels": to_record(self.kernels, self.paths), "inject": self.inject,
                "knobs": dataclasses.asdict(knobs) if knobs else None, "space": self.space,
                "allow_invalid": self.allow_invalid, "max_programs": self.max_programs,
                "profile": self.judged_by().name,
                "max_tokens_per_request": self.max_tokens_per_request,
                **({"sizing": self.sizing} if self.sizing else {})}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def explorer(self) -> str:
        if self.explore not in EXPLORERS:
            raise ConfigError("--explore", f"must be one of {', '.join(EXPLORERS)}, got {self.explore!r}")
        return self.explore

    def int32_slots(self) -> bool:
        """Whether a kernel under test writes int32 slot mappings (its ABI's ``out_dtype``): the default
        space then keeps every slot id below 2^31, as a larger one is inexpressible for it."""
        return any(ABIS[k.abi].out_dtype == "int32" for k in (self.kernels or {}).values() if k.abi in ABIS)

    def describe_space(self) -> str:
        extra = ", invalid CP layouts too" if self.allow_invalid else ""
        rule = INT32_SPACE if self.space == "default" and self.int32_slots() else SPACES[self.space]
        return f"{self.space} ({rule}{extra}; at most {self.max_programs} programs per path)"


@dataclass
class Progress:
    """Live counters the display reads (also handy in tests)."""

    examples: int = 0
    failures: int = 0           # failing scenarios seen (search and shrink)
    started: float = field(default_factory=time.monotonic)
    shrink: dict[str, int] | None = None   # size of the smallest failing scenario so far
    phase: str = "search"
    signatures: int = 0
    job: int = 0
    not_expressible: int = 0    # scenarios the profile's release cannot express: left out, not judged

    @property
    def rate(self) -> float:
        return self.examples / max(time.monotonic() - self.started, 1e-9)


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


@dataclass
class FuzzResult:
    examples: int
    elapsed_s: float
    findings: list[Finding] = field(default_factory=list)   # reported ones first, then ignored ones
    space: str = ""
    jobs: int = 1
    classify_runs: int = 0
    not_expressible: int = 0   # draws left out: the profile's release cannot express them

    @property
    def reported(self) -> list[Finding]:
        return [f for f in self.findings if not f.ignored]

    @property
    def found(self) -> bool:
        return bool(self.reported)

    # The first reported finding, for callers that want one (``--stop-after-first``, old tests).
    @property
    def scenario(self) -> sc.Scenario | None:
        return self.reported[0].scenario if self.found else None

    @property
    def repro(self) -> Path | None:
        return self.reported[0].repro if self.found else None


class _Searcher:
    """One job's search: evaluates, classifies and remembers every failing scenario."""

    def __init__(self, cfg: FuzzConfig, on_progress: Callable[[Progress], None] | None,
                 on_found: Callable[["Finding", int], None] | None = None):
        self.cfg = cfg
        self.on_found = on_found  # (finding, examples so far) at a signature's first sighting
        self.knobs = cfg.knobs if cfg.knobs is not None else resolve_fault(cfg.inject)
        self.sizer = None
        if cfg.sizing:
            from cpsim.run.sizing import Sizer
            self.sizer = Sizer(cfg.sizing, cfg.sizing_timeout)  # one child for the whole search
        self.sized = sized(self.knobs, self.sizer, cfg.paths)  # what the scenarios run with
        self.on_progress = on_progress
        self.prog = Progress(job=cfg.seed_stream)
        self.seen: dict[str, dict[str, str]] = {}   # fingerprint -> {signature: dimension}
        self.outcomes: dict[str, Outcome] = {}      # fingerprint -> outcome (failing ones)
        self.findings: dict[str, Finding] = {}
        self.done: set[str] = set()                 # signatures Hypothesis has shrunk and reported
        self.classify_runs = 0
        self.shrink_until: float | None = None
        self._ahead: dict[int, tuple] = {}           # id(scenario) -> (scenario, its allocations): started ahead

    def run(self, s: sc.Scenario, meanwhile: Callable[[], None] | None = None) -> Outcome:
        if meanwhile is not None and id(s) not in self._ahead:
            self.ahead(s)  # its own kernels first: what ``meanwhile`` starts queues behind them
        allocs = self._ahead.pop(id(s))[1] if id(s) in self._ahead else None
        return evaluate(s, self.cfg.paths, self.sized, self.cfg.device, self.cfg.kernels, allocs, meanwhile,
                        self.cfg.judged_by())

    def ahead(self, s: sc.Scenario) -> None:
        """Start ``s``'s kernels in the kernel workers now; its ``visit`` collects them (``isolation.ahead``)."""
        from cpsim.allocator import allocate_world
        from cpsim.run import isolation
        from cpsim.run.world import rank_knobs
        if profiled(s, self.cfg.judged_by())[0] is not s:
            return  # the profile lays it out anew (or cannot run it): its visit runs it then
        try:
            knobs = knobs_for_scenario(self.sized, s)
            allocs = allocate_world(s)
        except Exception:  # noqa: BLE001  (its visit meets the same error and records it)
            return
        self._ahead[id(s)] = (s, allocs)
        for old in list(self._ahead)[:-isolation.DEPTH]:  # drawn, never visited (a duplicate): forgotten
            del self._ahead[old]
        isolation.ahead(s, self.cfg.paths, allocs, self.cfg.device, rank_knobs(s, knobs), self.cfg.kernels or {})

    def classify(self, s: sc.Scenario, out: Outcome) -> dict[str, str]:
        """{signature: dimension} of a failing outcome. The dimensions present are removed one at
        a time, cumulatively, least invasive first; each failed (path, group, invariant) is put on
        the dimension whose removal cured it, else on ``any``."""
        left = _triples(out)
        dim_of: dict[tuple[str, str, str], str] = {}
        t = s
        for d in _ablation_order(s):
            if not left:
                break
            t2 = d.ablate(t)
            if t2 is None:
                continue
            self.classify_runs += 1
            now = _triples(self.run(t2))
            for x in left - now:
                dim_of[x] = d.name
            left &= now
            t = t2
        for x in left:
            dim_of[x] = ANY_DIMENSION
        by: dict[tuple[str, str, str], set[str]] = {}
        for (p, g, i), d in dim_of.items():
            by.setdefault((p, g, d), set()).add(i)
        return {signature_text(p, group_kind(s, g), signature_invariants(invs), d): d
                for (p, g, d), invs in by.items()}

    def visit(self, s: sc.Scenario, meanwhile: Callable[[], None] | None = None) -> dict[str, str] | None:
        """{signature: dimension} of ``s`` ({} when it passes), run once per fingerprint; None when
        the shrink budget is spent and ``s`` is new (it then counts as passing). ``meanwhile``: as for
        ``evaluate`` (called only when ``s`` is run)."""
        fp = s.fingerprint()
        if fp not in self.seen:
            if self.shrink_until is not None and time.monotonic() > self.shrink_until:
                # Shrink budget spent: new candidates pass, so the shrinker stops; the
                # failures already seen stay failures, so the result is one of them.
                self.prog.phase = "shrink (budget spent)"
                return None
            self.prog.examples += 1
            out = self.run(s, meanwhile)
            self.prog.not_expressible += bool(out.not_expressible)
            sigs = self.classify(s, out) if out.failed else {}
            self.seen[fp] = sigs
            if sigs:
                self.prog.failures += 1
                self.outcomes[fp] = out
                self.record(s, out, sigs)
        if self.on_progress:
            self.on_progress(self.prog)
        return self.seen[fp]

    def live(self, sigs) -> list[str]:
        """The signatures of ``sigs`` still to shrink, the earliest found first."""
        return sorted((x for x in sigs if x not in self.done and not self.findings[x].ignored),
                      key=lambda x: self.findings[x].first_seen)

    def check(self, s: sc.Scenario) -> None:
        """Hypothesis' test: raises one failure type per signature, so each is shrunk on its own."""
        sigs = self.visit(s)
        live = self.live(sigs or {})
        if live:
            if self.shrink_until is None:
                self.shrink_until = time.monotonic() + self.cfg.shrink_seconds
                self.prog.phase = "shrink"
            # --stop-after-first: one exception type, so Hypothesis shrinks toward any failure (today's behaviour).
            kind = _failure_type("") if self.cfg.stop_after_first else _failure_type(live[0])
            err = kind(f"{live[0]} ({', '.join(self.outcomes[s.fingerprint()].invariants())})")
            err.signature = live[0]
            raise err

    def record(self, s: sc.Scenario, out: Outcome, sigs: dict[str, str]) -> None:
        for sig, dim in sigs.items():
            f = self.findings.get(sig)
            if f is None:
                f = self.findings[sig] = Finding(sig, self.prog.examples, s, out.summary(), dim,
                                                 self.cfg.seed_stream, ignored=matches(sig, self.cfg.ignore))
                self.prog.signatures = sum(not x.ignored for x in self.findings.values())
                if self.on_found is not None and not f.ignored:
                    self.on_found(f, self.prog.examples)
            elif size_key(s) < size_key(f.scenario):
                f.scenario, f.summary = s, out.summary()
            if self.prog.shrink is None or size_key(s) < size_key(self._smallest):
                self._smallest = s
                self.prog.shrink = size(s)

    def reported(self) -> bool:
        return any(not f.ignored for f in self.findings.values())


def _fails_as(me: _Searcher, s: sc.Scenario, sig: str) -> bool:
    return sig in (me.visit(s) or {})


def shrink_cache(me: _Searcher, f: Finding) -> None:
    """Lower each group's ``num_blocks`` of ``f.scenario`` toward the smallest that still shows ``f``'s
    signature. Hypothesis rarely does it: a big cache is drawn counted down from the space's cap, so the
    smallest choice there is the cap itself, and a failure that needs ids past 2^24 does not survive its
    jump to the small-cache branch. Bisection per group between the blocks the batch needs (tried first)
    and the failing size; block ids are drawn afresh for every size, so failing is not monotone in it,
    and what is found is a size that fails one block above a size that does not. Only ever lowers a
    cache, so the space's rule (``space.cache_cap``) holds; the signature includes its dimension, so a
    failure put on ids past 2^24 stays there. ``me.visit`` records every smaller failing scenario."""
    for gi in range(len(f.scenario.groups)):
        def at(n: int, base=f.scenario) -> sc.Scenario:
            return base.replace(groups=tuple(dataclasses.replace(g, num_blocks=n) if i == gi else g
                                             for i, g in enumerate(base.groups)))
        g = f.scenario.groups[gi]
        lo = max(2, sc.max_blocks_needed(f.scenario, g) + 1)
        hi = g.num_blocks
        if hi <= lo:
            continue
        if _fails_as(me, at(lo), f.signature):
            hi = lo
        else:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _fails_as(me, at(mid), f.signature):
                    hi = mid
                else:
                    lo = mid
        if hi < g.num_blocks:
            f.scenario = at(hi)
            f.summary = me.outcomes[f.scenario.fingerprint()].summary()


def shrink_caches(me: _Searcher) -> None:
    """``shrink_cache`` for every reported finding, within a fresh shrink budget."""
    me.shrink_until = time.monotonic() + me.cfg.shrink_seconds
    me.prog.phase = "shrink caches"
    for f in list(me.findings.values()):
        if not f.ignored:
            shrink_cache(me, f)


def finish(cfg: FuzzConfig, me: _Searcher) -> FuzzResult:
    elapsed = time.monotonic() - me.prog.started
    findings = merge_nested(list(me.findings.values()))
    if cfg.stop_after_first:  # today's behaviour: the one violation Hypothesis shrank
        shown = [f for f in findings if not f.ignored]
        first = ([f for f in shown if f.shrunk] or shown)[:1]
        findings = first + [f for f in findings if f.ignored]
    return FuzzResult(me.prog.examples, elapsed, findings, cfg.space, 1, me.classify_runs,
                      me.prog.not_expressible)


def search(cfg: FuzzConfig, on_progress: Callable[[Progress], None] | None = None,
           on_found: Callable[[Finding, int], None] | None = None) -> FuzzResult:
    """One job: rounds of Hypothesis (generate, then shrink every new signature it raised)
    until the example budget or the time is spent; with ``explore="random"`` the plain-random
    explorer instead (``cpsim.fuzz.explore``). Writes nothing; ``on_found(finding, examples)`` is
    told of each new signature as it is first seen.

    Interrupted (Ctrl-C, or SIGTERM through ``cpsim.errors.Interrupted``), it re-raises with what was
    found so far as the exception's ``partial`` (a ``FuzzResult``, shrunk as far as it got), for the
    caller to write."""
    _hypothesis()
    import torch

    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add contention
    me = _Searcher(cfg, on_progress, on_found)
    try:
        return _search(cfg, me)
    except (KeyboardInterrupt, Interrupted) as e:
        e.partial = finish(cfg, me)
        raise
    finally:
        if me.sizer is not None:
            me.sizer.close()


def _search(cfg: FuzzConfig, me: _Searcher) -> FuzzResult:
    from hypothesis import Phase
    if cfg.explorer() == "random":
        from cpsim.run import isolation
        try:
            _explore.explore(me)
        finally:
            isolation.forget_ahead()  # a scenario drawn ahead and never visited: its results go
        shrink_caches(me)
        return finish(cfg, me)
    strategy, db = strategy_of(cfg), database_of(cfg)
    deadline = time.monotonic() + cfg.minutes * 60 if cfg.minutes else None
    round_ = 0
    while True:
        budget = cfg.max_examples - me.prog.examples if deadline is None else 100
        if budget <= 0:
            break
        me.prog.phase = "search"
        seed = None if cfg.seed is None else cfg.seed + cfg.seed_stream * SEED_STRIDE + round_
        ran = hypothesis_round(me, strategy, db, budget, [Phase.reuse, Phase.generate, Phase.shrink], seed)
        round_ += 1
        if ran == 0:
            break  # the round drew nothing new (a tiny budget replays the simplest scenario)
        if cfg.stop_after_first and me.reported():
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
    shrink_caches(me)
    return finish(cfg, me)


# ---- several jobs --------------------------------------------------------------------

def _finding_record(f: Finding) -> dict:
    """A finding as plain data, for the queue to the parent."""
    return {**dataclasses.asdict(f), "scenario": f.scenario.to_dict(), "repro": None}


def _finding_from(x: dict) -> Finding:
    return Finding(**{**x, "scenario": sc.Scenario.from_dict(x["scenario"])})


def _job(cfg_state: dict, kernels_record: dict, queue, workers: str) -> None:
    """A job process: its own seed stream, the shared (keyed) example database. It tells the parent, over
    ``queue``, its progress, each new signature as first seen ("found", with the scenario), and at its
    end its result ("done") or its error ("failed"); so the parent holds every finding so far even if
    it has to stop this job. Ctrl-C is the parent's to handle (a terminal sends it to the whole group);
    SIGTERM, the parent's stop, ends the search with SystemExit, so this process's exit ends its own
    kernel workers; once the search has ended, SIGTERM is ignored (the process is already leaving)."""
    import signal
    import traceback
    from cpsim.fuzz.stop import end_job
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, end_job)  # the kernel workers end before the job unwinds
    os.environ["CPSIM_KERNEL_WORKERS"] = workers
    job = cfg_state["seed_stream"]
    try:
        from cpsim.kernels import use_interpreter
        from cpsim.run import isolation  # noqa: F401  (kernel SPECs are imported by its workers only)
        from cpsim.kernels.under_test import from_record

        use_interpreter()
        cfg = FuzzConfig(**cfg_state, kernels=from_record(kernels_record, "cpu"))
        last = [0.0]

        def tell(p: Progress) -> None:
            now = time.monotonic()
            if now - last[0] > 0.25:
                last[0] = now
                queue.put(("progress", job, (p.examples, p.signatures, p.phase)))

        def found(f: Finding, examples: int) -> None:
            queue.put(("found", job, (_finding_record(f), examples)))

        r = search(cfg, tell, found)
        queue.put(("progress", job, (r.examples, len(r.reported), "done")))
        queue.put(("done", job, {"examples": r.examples, "classify_runs": r.classify_runs,
                                 "not_expressible": r.not_expressible,
                                 "findings": [_finding_record(f) for f in r.findings]}))
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - a bug in cpsim itself: the parent raises it
        queue.put(("failed", job, traceback.format_exc()))
    finally:
        # The job is leaving either way. A SIGTERM now (the parent stopping every job once one failed)
        # would raise SystemExit inside the exit's own finalizers and print their traceback; the parent
        # SIGKILLs a job that does not finish leaving within its bound.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def merge(results: list[FuzzResult]) -> list[Finding]:
    """One finding per signature: the earliest sighting, the smallest scenario, shrunk if any job shrank it."""
    best: dict[str, Finding] = {}
    for r in results:
        for f in r.findings:
            b = best.get(f.signature)
            if b is None:
                best[f.signature] = dataclasses.replace(f)
                continue
            if size_key(f.scenario) < size_key(b.scenario):
                b.scenario, b.summary = f.scenario, f.summary
            if (f.first_seen, f.job) < (b.first_seen, b.job):
                b.first_seen, b.job = f.first_seen, f.job
            b.shrunk = b.shrunk or f.shrunk
            b.also = sorted(set(b.also) | set(f.also))
    return merge_nested(list(best.values()))


class JobFailed(RuntimeError):
    """A fuzz job process raised (a bug in cpsim) or died before it reported its result.

    ``job``: its index; ``cause``: one line; ``trace``: the job's own traceback ("" when it died)."""

    def __init__(self, job: int, cause: str, trace: str = ""):
        super().__init__(f"fuzz job {job} failed: {cause}")
        self.job, self.cause, self.trace = job, cause, trace


class _Jobs:
    """The parent's side of ``search_jobs``: the job processes and what they have said so far."""

    def __init__(self, ctx, states: list[dict], record: dict, workers: str,
                 on_progress: Callable[[dict], None] | None, on_found: Callable[[Finding, int], None] | None):
        self.queue = ctx.Queue()
        self.on_progress, self.on_found = on_progress, on_found
        self.status: dict[int, tuple] = {}
        self.found: dict[int, list[Finding]] = {}
        self.done: dict[int, dict] = {}
        self.procs = {st["seed_stream"]: ctx.Process(target=_job, args=(st, record, self.queue, workers),
                                                     name=f"cpsim-fuzz-job-{st['seed_stream']}")
                      for st in states}
        for p in self.procs.values():
            p.start()

    def take(self, timeout: float) -> bool:
        """Handle one message from a job, waiting up to ``timeout``; False when none came."""
        import queue as queue_mod
        try:
            kind, job, body = self.queue.get(timeout=timeout)
        except queue_mod.Empty:
            return False
        if kind == "progress":
            self.status[job] = body
            if self.on_progress:
                self.on_progress(self.status)
        elif kind == "found":
            f = _finding_from(body[0])
            self.found.setdefault(job, []).append(f)
            if self.on_found:
                self.on_found(f, body[1])
        elif kind == "done":
            self.done[job] = body
        elif kind == "failed":
            self.stop()
            lines = [ln for ln in body.strip().splitlines() if ln.strip()]
            raise JobFailed(job, lines[-1].strip() if lines else "it raised", body)
        return True

    def wait(self) -> None:
        """Until every job has reported its result."""
        while len(self.done) < len(self.procs):
            if self.take(0.3):
                continue
            for job, p in self.procs.items():
                if job not in self.done and not p.is_alive() and not self.take(0.5):
                    self.stop()
                    raise JobFailed(job, f"its process ended (exit code {p.exitcode}) before it reported its result")
        for p in self.procs.values():
            p.join()

    def stop(self, bound_s: float = 10.0) -> None:
        """End every job (SIGTERM, then SIGKILL past ``bound_s``), keeping what they send meanwhile."""
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()
        end = time.monotonic() + bound_s
        while any(p.is_alive() for p in self.procs.values()) and time.monotonic() < end:
            self.take(0.05)  # a job blocked writing to a full queue needs it read
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
            p.join()
        while self.take(0):
            pass
        self.queue.close()

    def partial(self, started: float, space: str) -> FuzzResult:
        """Every finding the jobs reported so far, merged."""
        results = [FuzzResult(0, 0.0, fs, space) for fs in self.found.values()]
        return FuzzResult(sum(v[0] for v in self.status.values()), time.monotonic() - started, merge(results),
                          space, len(self.procs))


def search_jobs(cfg: FuzzConfig, on_progress: Callable[[dict], None] | None = None,
                on_found: Callable[[Finding, int], None] | None = None) -> FuzzResult:
    """``cfg.jobs`` job processes, each its own seed stream; the example budget is split. Each job sends
    every new signature to this process as first seen (``on_found(finding, examples)`` is told here), so an
    interrupt (Ctrl-C, SIGTERM) stops the jobs and re-raises with every finding so far as ``partial``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch / Triton state
    started = time.monotonic()
    share = [cfg.max_examples // cfg.jobs + (j < cfg.max_examples % cfg.jobs) for j in range(cfg.jobs)]
    states = []
    for j in range(cfg.jobs):
        st = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(FuzzConfig) if f.name != "kernels"}
        st.update(max_examples=max(share[j], 1), seed_stream=cfg.seed_stream * cfg.jobs + j, jobs=1)
        states.append(st)
    record = to_record(cfg.kernels, cfg.paths)
    from cpsim.run.isolation import usable_cores
    workers = os.environ.get("CPSIM_KERNEL_WORKERS") or str(max(1, usable_cores() // cfg.jobs))  # the cores, shared out
    jobs = None
    try:
        jobs = _Jobs(ctx, states, record, workers, on_progress, on_found)
        jobs.wait()
    except (KeyboardInterrupt, Interrupted) as e:
        if jobs is not None:
            jobs.stop()
            e.partial = jobs.partial(started, cfg.space)
        raise
    jobs.queue.close()
    results = [FuzzResult(d["examples"], 0.0, [_finding_from(x) for x in d["findings"]], cfg.space, 1,
                          d["classify_runs"], d["not_expressible"]) for _, d in sorted(jobs.done.items())]
    return FuzzResult(sum(r.examples for r in results), time.monotonic() - started, merge(results), cfg.space,
                      cfg.jobs, sum(r.classify_runs for r in results), sum(r.not_expressible for r in results))


# ---- writing the findings -------------------------------------------------------------

def check_out_dir(out: str | Path) -> Path:
    """Create ``out`` and prove it writable now, before any search (ConfigError otherwise)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".cpsim-write-test-"):
            pass
    except OSError as e:
        raise ConfigError("--out", f"cannot write to {out}: {e.strerror or e}") from None
    return out


def repro_of(cfg: FuzzConfig, f: Finding, examples: int) -> Repro:
    """The repro file's content for finding ``f`` after ``examples`` scenarios."""
    knobs = cfg.knobs if cfg.knobs is not None else resolve_fault(cfg.inject)
    return Repro(f.scenario, cfg.paths, knobs_for_scenario(knobs, f.scenario), cfg.inject, f.summary,
                 to_record(cfg.kernels, cfg.paths), profile=cfg.judged_by().name, sizing=cfg.sizing,
                 extra={"fuzz": {"seed": cfg.seed, "job": f.job, "space": cfg.space, "signature": f.signature,
                                 "first_seen": f.first_seen, "examples": examples,
                                 "allow_invalid": cfg.allow_invalid}})


def write_findings(cfg: FuzzConfig, result: FuzzResult, interrupted: str | None = None) -> list[str]:
    """One repro per reported signature, then fuzz-summary.json. Repros first; a repro that
    cannot go to ``cfg.out`` goes to a temporary directory instead. Returns one line per problem.
    ``interrupted``: the signal that stopped the search (the summary then says so)."""
    problems = []
    fallback: Path | None = None
    for f in result.reported:
        r = repro_of(cfg, f, result.examples)
        try:
            f.repro = write_repro(cfg.out, r)
        except OSError as e:
            if fallback is None:
                fallback = Path(tempfile.mkdtemp(prefix="cpsim-repro-"))
            f.repro = write_repro(fallback, r)
            f.repro_error = f"could not write to {cfg.out} ({e.strerror or e}); written to {f.repro}"
            problems.append(f.repro_error)
    summary = {"schema": "cpsim-fuzz-summary/1", "space": cfg.describe_space(), "examples": result.examples,
               "not_expressible": result.not_expressible, "elapsed_s": round(result.elapsed_s, 3), "jobs": result.jobs, "seed": cfg.seed,
               "paths": cfg.paths, "inject": cfg.inject, **({"sizing": cfg.sizing} if cfg.sizing else {}),
               "signatures": [f.to_dict() for f in result.findings],
               **({"interrupted": interrupted} if interrupted else {})}
    try:
        (Path(cfg.out) / cfg.summary_name).write_text(json.dumps(summary, indent=2) + "\n")
    except OSError as e:
        problems.append(f"could not write {Path(cfg.out) / cfg.summary_name}: {e.strerror or e}")
    return problems


def fuzz(cfg: FuzzConfig, on_progress: Callable[[Progress], None] | None = None) -> FuzzResult:
    """Search (one job in this process, or ``cfg.jobs`` workers), then write one repro per signature."""
    if cfg.space not in SPACES:
        raise ConfigError("--space", f"must be one of {', '.join(SPACES)}, got {cfg.space!r}")
    result = search(cfg, on_progress) if cfg.jobs <= 1 else search_jobs(cfg)
    write_findings(cfg, result)
    return result


def replay(r: Repro, device: str = "cpu", kernels: dict | None = None, sizer=None) -> Outcome:
    """Rerun a repro in the virtual world with the knobs it recorded.

    ``kernels``: the loaded kernels under test (``cpsim replay`` loads the recorded ones,
    ``kernel_under_test.from_record(r.kernels)``, with command-line overrides); ``sizer``: the host
    sizing under test (``cpsim.run.sizing.Sizer``; ``cpsim replay`` builds it from ``r.sizing`` or
    ``--sizing``), asked for the scenario as the profile lays it out."""
    prof = profiles.get(r.profile) if r.profile else profiles.for_abis([k.abi for k in (kernels or {}).values()])
    return evaluate(r.scenario, r.paths, sized(r.knobs, sizer, r.paths), device, kernels, profile=prof)

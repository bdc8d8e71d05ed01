"""One job's search: the configuration, the searcher that evaluates, classifies and remembers every
failing scenario, the shrinking of each signature, and the result."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cpsim import scenario as sc
from cpsim.check import profiles
from cpsim.errors import ConfigError, Interrupted
from cpsim.fuzz import DEFAULT_DB, DEFAULT_PATHS, EXPLORERS
from cpsim.fuzz import explore as _explore
from cpsim.fuzz.repro import Outcome, evaluate, knobs_for_scenario, profiled, resolve_fault, size, size_key, sized
from cpsim.fuzz.rounds import SEED_STRIDE, _failure_type, _hypothesis, database_of, hypothesis_round, strategy_of
from cpsim.fuzz.signature import (ANY_DIMENSION, Finding, _ablation_order, _triples, group_kind, matches,
                                  merge_nested, signature_invariants, signature_text)
from cpsim.kernels.under_test import ABIS, to_record
from cpsim.paths import Knobs
from cpsim.run.host_sizer import Sizer

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

    examples: int = 0           # scenarios run: drawn ones and shrink runs (what --max-examples bounds)
    shrink_runs: int = 0        # of those, the runs not drawn: shrinking, replaying saved failures
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

    @property
    def drawn(self) -> int:
        """Scenarios drawn by the search (phase "search"), shrink runs left out."""
        return self.examples - self.shrink_runs


@dataclass
class FuzzResult:
    examples: int
    elapsed_s: float
    findings: list[Finding] = field(default_factory=list)   # reported ones first, then ignored ones
    space: str = ""
    jobs: int = 1
    classify_runs: int = 0
    not_expressible: int = 0   # draws left out: the profile's release cannot express them
    shrink_runs: int = 0       # of ``examples``, the runs that shrank a failure (or replayed a saved one)

    @property
    def drawn(self) -> int:
        """Scenarios the search drew (``examples`` without the shrink runs)."""
        return self.examples - self.shrink_runs

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
                 on_found: Callable[["Finding", int], None] | None = None, runner=None):
        self.cfg = cfg
        self.runner = runner  # the KernelRunner every scenario's kernels run on (``search``'s)
        self.on_found = on_found  # (finding, examples so far) at a signature's first sighting
        self.knobs = cfg.knobs if cfg.knobs is not None else resolve_fault(cfg.inject)
        self.sizer = None
        if cfg.sizing:
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
                        self.cfg.judged_by(), self.runner)

    def ahead(self, s: sc.Scenario) -> None:
        """Start ``s``'s kernels in the kernel workers now; its ``visit`` collects them (``KernelRunner.ahead``)."""
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
        self.runner.ahead(s, self.cfg.paths, allocs, self.cfg.device, rank_knobs(s, knobs), self.cfg.kernels or {})

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
            # Runs in any other phase are the shrinker's (or the database's replay). Under --explore hypothesis
            # the round's first failure is drawn; the draws Hypothesis makes after it count as shrink runs.
            self.prog.shrink_runs += self.prog.phase != "search"
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
                      me.prog.not_expressible, me.prog.shrink_runs)


def search(cfg: FuzzConfig, on_progress: Callable[[Progress], None] | None = None,
           on_found: Callable[[Finding, int], None] | None = None, runner=None) -> FuzzResult:
    """One job: rounds of Hypothesis (generate, then shrink every new signature it raised)
    until the example budget or the time is spent; with ``explore="random"`` the plain-random
    explorer instead (``cpsim.fuzz.explore``). Writes nothing; ``on_found(finding, examples)`` is
    told of each new signature as it is first seen. ``runner``: the ``KernelRunner`` of every scenario's
    kernels (the caller's; none: one of the search's own).

    Interrupted (Ctrl-C, or SIGTERM through ``cpsim.errors.Interrupted``), it re-raises with what was
    found so far as the exception's ``partial`` (a ``FuzzResult``, shrunk as far as it got), for the
    caller to write."""
    _hypothesis()
    import torch

    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add contention
    from cpsim.run.runner import given
    with given(runner) as r:
        me = _Searcher(cfg, on_progress, on_found, r)
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
        try:
            _explore.explore(me)
        finally:
            me.runner.forget_ahead()  # a scenario drawn ahead and never visited: its results go
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

"""Search the scenario space for a violation, shrink it, hand it over as a file.

Hypothesis draws scenarios that are valid by construction (``scenario.validate``
accepts every one of them unless ``allow_invalid`` asks for broken CP layouts),
runs them in the virtual world and lets the coordinator judge. A violating
scenario is shrunk by Hypothesis and written as a repro file that ``cpsim
replay`` (or any cpsim, on any machine) reruns.

Sizes are kept small on purpose: the Triton interpreter runs one program per
request per group per rank per path, at a few milliseconds each, so the strategy
spends its budget on *positions* (anywhere up to ``max_model_len``, where the
int32 / float32 / window limits live) rather than on token counts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cpsim import __version__
from cpsim.check import coordinator
from cpsim import scenario as sc
from cpsim.errors import ConfigError
from cpsim.plugin.kernel_under_test import to_record
from cpsim.paths import Knobs

REPRO_SCHEMA = "cpsim-repro/1"
DEFAULT_DB = Path(".cpsim") / "hypothesis"
DEFAULT_PATHS = ("v1", "v2")
MAX_TABLE_ENTRIES = 1 << 22      # int32 entries per group table (16 MiB): bounds max_model_len
MAX_MODEL_LEN = 1 << 24
MAX_MODEL_LEN_INVALID = 1 << 20  # invalid layouts count blocks by scanning positions
INT32_MAX = sc.INT32_MAX


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


# ---- the scenario strategy ---------------------------------------------------

GROUP_CHOICES = ("attention", "attention-unsharded", "sliding_window", "mamba")
REQUEST_KINDS = ("decode", "prefill", "chunked", "spec", "empty")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _programs(world: int, groups: int, reqs: int) -> int:
    return world * groups * (reqs + 1)


def scenarios(allow_invalid: bool = False, max_programs: int = 48, max_tokens_per_request: int = 24,
              max_world: int = 16):
    """Hypothesis strategy of scenarios that ``scenario.validate`` accepts.

    ``max_programs`` bounds world x groups x (requests + 1), the interpreter
    programs one path launches; large worlds get fewer requests.
    """
    from hypothesis import strategies as st

    def small_or(lo: int, small: int, hi: int):
        """Mostly small values (cheap to interpret, quick to shrink), sometimes anything up to ``hi``."""
        small = min(small, hi)
        return st.one_of(st.integers(lo, max(lo, small // 2)), st.integers(lo, small), st.integers(lo, hi))

    pow2 = [1 << i for i in range(13)]

    @st.composite
    def group(draw) -> tuple[sc.KVGroup, int]:
        """A group (num_blocks still open) and its spare blocks: a few, or a huge sparse cache."""
        kind = draw(st.sampled_from(GROUP_CHOICES))
        bpk = 1 if kind in ("sliding_window", "mamba") else draw(small_or(1, 4, 16))
        b_max = 4096 // bpk
        b = draw(st.one_of(st.sampled_from([p for p in pow2 if p <= b_max]), st.integers(1, b_max)))
        # Hypothesis favours small magnitudes, so "the biggest cache the int32 table allows" is its own branch.
        spare = draw(st.one_of(st.integers(0, 64), st.integers(0, INT32_MAX), st.just(INT32_MAX)))
        g = sc.KVGroup(kind, "attention" if kind.startswith("attention") else kind, b * bpk,
                       b if bpk > 1 else 0, kind == "attention", num_blocks=2)
        return g, spare

    @st.composite
    def request(draw, mml: int, spec: int) -> sc.Request:
        kind = draw(st.sampled_from(REQUEST_KINDS))
        q = {"decode": 1, "spec": 1 + spec, "empty": 0}.get(kind)
        if q is None:
            q = draw(small_or(1, 4, max_tokens_per_request))
        q = min(q, mml)
        room = mml - q
        # Few tokens, but anywhere up to max_model_len (or right below it): big positions are cheap.
        ctx = 0 if kind == "prefill" else draw(st.one_of(st.integers(0, room), st.integers(max(0, room - 16), room)))
        # Rejected / excess drafts of a spec request are padding (shrinks to none).
        padded_drafts = draw(st.integers(0, q - 1)) if kind == "spec" and q > 1 else 0
        return sc.Request(ctx, q, kind, padded_drafts)

    @st.composite
    def build(draw) -> sc.Scenario:
        # Lists (not counts + loops) so the shrinker can delete a group or a request outright.
        world = draw(small_or(1, 4, max_world))
        pcp = draw(st.sampled_from(_divisors(world)))
        drawn = draw(st.lists(group(), min_size=1, max_size=draw(small_or(1, 2, 5))))
        groups = [dataclasses.replace(g, name=f"g{i}-{g.name}") for i, (g, _) in enumerate(drawn)]
        # Interleave: a divisor of every CP-sharded block size (the global rule), or anything when allowed.
        sharded_b = [g.block_size for g in groups if world > 1 and g.cp_sharded and g.kind == "attention"]
        common = math.gcd(*sharded_b) if sharded_b else max(g.block_size for g in groups)
        invalid = allow_invalid and draw(st.booleans())
        # I = B (the largest choice) is common in deployments and is where I > b bites with hybrid blocks.
        interleave = draw(st.integers(1, 2 * max(g.block_size for g in groups)) if invalid
                          else st.one_of(st.sampled_from(_divisors(common)), st.just(common)))
        cp = sc.CPConfig(dcp=world // pcp, pcp=pcp, interleave=interleave)
        # A CP size per sharded group: 0 (the world size, where shrinking goes) or any divisor.
        groups = [dataclasses.replace(g, cp_size=draw(st.sampled_from([0] + _divisors(world))))
                  if g.cp_sharded and g.kind == "attention" and world > 1 else g for g in groups]

        budget_reqs = max(1, min(64, max_programs // (world * len(groups)) - 1))
        spec = draw(small_or(0, 2, 6))
        extra_rows = draw(small_or(0, 2, 16))
        # Table memory bounds max_model_len (v1 tables of unsharded groups are N times wider).
        rows = budget_reqs + extra_rows
        cap = min(max(1, MAX_TABLE_ENTRIES // (rows * g.bpk * world)) * g.block_size for g in groups)
        cap = min(cap, MAX_MODEL_LEN_INVALID if invalid else MAX_MODEL_LEN)
        mml = draw(st.one_of(st.integers(1, min(256, cap)), st.integers(1, cap), st.just(cap)))
        reqs = draw(st.lists(request(mml, spec), min_size=1, max_size=draw(small_or(1, 3, budget_reqs))))
        nreq = len(reqs)
        max_num_reqs = nreq + extra_rows
        total = sum(r.num_tokens for r in reqs)
        draft = max(spec - 1, 0) * max_num_reqs
        # Batched-token limit from "draft slots nearly full" to some slack.
        mnbt = draw(st.integers(max(1, total - draft), total + 64))
        limits = sc.Limits(mml, max_num_reqs, mnbt, spec)
        if draw(st.booleans()):
            idx = ()
        else:
            perm = draw(st.permutations(range(max_num_reqs)))[:nreq]
            idx = tuple(-1 if r.num_tokens == 0 and draw(st.booleans()) else int(x) for r, x in zip(reqs, perm))
        padded = draw(st.integers(total, limits.slot_buffer_size)) if draw(st.booleans()) else 0
        flagged = tuple(sorted(draw(st.sets(st.integers(0, total - 1), max_size=min(total, 3))))) if total else ()
        s = sc.Scenario("fuzz", cp, tuple(groups), limits, sc.Batch(tuple(reqs), idx, padded, flagged),
                        seed=draw(st.integers(0, 2**16)), allow_invalid=invalid)
        sized = []
        for g, (_, spare) in zip(s.groups, drawn):
            need = sc.max_blocks_needed(s, g) + 1
            sized.append(dataclasses.replace(g, num_blocks=max(2, min(need + spare, max(need, INT32_MAX // g.bpk)))))
        return sc.validate(s.replace(groups=tuple(sized)))

    return build()


def size(s: sc.Scenario) -> dict[str, int]:
    """What a shrunk scenario is measured by."""
    return {"world": s.cp.world, "groups": len(s.groups), "requests": s.batch.num_reqs,
            "tokens": s.batch.num_tokens}


# ---- one evaluation ------------------------------------------------------------

@dataclass
class Outcome:
    """What one scenario did: failing (invariant, path) pairs and their messages."""

    verdicts: list[coordinator.Verdict]
    error: str = ""
    gathered: dict = field(default_factory=dict, repr=False)  # path -> world.Gathered (for pictures)

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


def evaluate(s: sc.Scenario, paths: list[str], knobs: Knobs = Knobs(), device: str = "cpu",
             kernels: dict | None = None) -> Outcome:
    """Run the virtual world and the coordinator; an exception is an outcome too.

    ``kernels`` maps a path to the user's kernel (``cpsim.plugin.kernel_under_test``) replacing the built-in one."""
    from cpsim.allocator import allocate_world
    from cpsim.run.world import run_virtual

    knobs = knobs_for_scenario(knobs, s)
    try:
        gathered = run_virtual(s, paths, knobs, device=device, kernels=kernels)
        verdicts = coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world)
    except ConfigError:
        raise
    except Exception as e:  # a crash in a path is a finding, shrunk like any other
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
    return Repro(s, list(data.get("paths") or DEFAULT_PATHS), knobs, data.get("inject"),
                 data.get("violation", {}), kernels)


# ---- the search ------------------------------------------------------------------

@dataclass
class FuzzConfig:
    paths: list[str] = field(default_factory=lambda: list(DEFAULT_PATHS))
    inject: str | None = None
    knobs: Knobs | None = None           # overrides ``inject``'s knobs when given
    max_examples: int = 300
    minutes: float | None = None         # keep searching (in rounds) until this much time has passed
    seed: int | None = 0                 # None: random, and the example database is used
    allow_invalid: bool = False
    out: Path = Path("out")
    database: Path | None = DEFAULT_DB   # None: no example database
    max_programs: int = 48
    max_tokens_per_request: int = 24
    shrink_seconds: float = 60.0         # then stop shrinking and keep the smallest failure so far
    device: str = "cpu"
    kernels: dict = field(default_factory=dict)  # path -> KernelUnderTest replacing the built-in kernel


@dataclass
class Progress:
    """Live counters the display reads (also handy in tests)."""

    examples: int = 0
    failures: int = 0           # failing runs seen (the first, then every shrink step that still fails)
    started: float = field(default_factory=time.monotonic)
    shrink: dict[str, int] | None = None   # size of the smallest failing scenario so far
    phase: str = "search"

    @property
    def rate(self) -> float:
        return self.examples / max(time.monotonic() - self.started, 1e-9)


@dataclass
class FuzzResult:
    examples: int
    elapsed_s: float
    scenario: sc.Scenario | None = None
    outcome: Outcome | None = None
    repro: Path | None = None

    @property
    def found(self) -> bool:
        return self.scenario is not None


def _smaller(a: dict[str, int], b: dict[str, int] | None) -> bool:
    key = ("requests", "tokens", "groups", "world")
    return b is None or tuple(a[k] for k in key) < tuple(b[k] for k in key)


def fuzz(cfg: FuzzConfig, on_progress: Callable[[Progress], None] | None = None) -> FuzzResult:
    """Search; on a violation shrink it and write the repro. Returns what was found."""
    try:
        import hypothesis
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis.database import DirectoryBasedExampleDatabase
    except ImportError:
        raise ConfigError("fuzz", "Hypothesis is not installed: pip install -e .[fuzz]") from None
    import torch

    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add contention
    knobs = cfg.knobs if cfg.knobs is not None else resolve_fault(cfg.inject)
    prog = Progress()
    last: dict[str, Any] = {}
    strategy = scenarios(cfg.allow_invalid, cfg.max_programs, cfg.max_tokens_per_request)
    db = DirectoryBasedExampleDatabase(str(cfg.database)) if cfg.database else None
    deadline = time.monotonic() + cfg.minutes * 60 if cfg.minutes else None

    failing: dict[str, Outcome] = {}   # fingerprint -> outcome of every failing scenario seen
    shrink_until: list[float] = []

    def check(s: sc.Scenario) -> None:
        fp = s.fingerprint()
        if fp in failing:  # Hypothesis replays its final (smallest) failure: same answer, no rerun
            out = failing[fp]
        elif shrink_until and time.monotonic() > shrink_until[0]:
            # Shrink budget spent: report every new candidate as passing so the shrinker
            # stops; the failures already seen stay failures, so the result is one of them.
            prog.phase = "shrink (budget spent)"
            return
        else:
            prog.examples += 1
            out = evaluate(s, cfg.paths, knobs, cfg.device, cfg.kernels)
        if out.failed:
            if fp not in failing:
                prog.failures += 1
                failing[fp] = out
            if not shrink_until:
                shrink_until.append(time.monotonic() + cfg.shrink_seconds)
            prog.phase = "shrink"
            sz = size(s)
            if _smaller(sz, prog.shrink):
                prog.shrink = sz
            last["s"], last["out"] = s, out
        if on_progress:
            on_progress(prog)
        if out.failed:
            raise AssertionError(f"invariants violated: {', '.join(out.invariants())}")

    round_ = 0
    while not failing:
        seed = None if cfg.seed is None else cfg.seed + round_
        test = settings(
            max_examples=cfg.max_examples, database=db, deadline=None, derandomize=False,
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False,
        )(given(strategy)(check))
        if seed is not None:
            test = hypothesis.seed(seed)(test)
        try:
            test()
        except Exception:
            if "s" not in last:  # not a violation: a bug in cpsim itself
                raise
            break
        round_ += 1
        if deadline is None or time.monotonic() >= deadline:
            break
    elapsed = time.monotonic() - prog.started
    if "s" not in last:
        return FuzzResult(prog.examples, elapsed)
    s, outcome = last["s"], last["out"]
    repro = write_repro(cfg.out, Repro(s, cfg.paths, knobs_for_scenario(knobs, s), cfg.inject, outcome.summary(),
                                       to_record(cfg.kernels, cfg.paths), extra={"fuzz": {"seed": cfg.seed, "examples": prog.examples,
                                                       "allow_invalid": cfg.allow_invalid}}))
    return FuzzResult(prog.examples, elapsed, s, outcome, repro)


def replay(r: Repro, device: str = "cpu", kernels: dict | None = None) -> Outcome:
    """Rerun a repro in the virtual world with the knobs it recorded.

    ``kernels``: the loaded kernels under test (``cpsim replay`` loads the recorded ones,
    ``kernel_under_test.from_record(r.kernels)``, with command-line overrides)."""
    return evaluate(r.scenario, r.paths, r.knobs, device, kernels)

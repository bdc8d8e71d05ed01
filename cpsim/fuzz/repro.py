"""One evaluation of a scenario (run the virtual world, judge it) and the repro files that record one."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cpsim import __version__
from cpsim import scenario as sc
from cpsim.check import coordinator, profiles
from cpsim.errors import ConfigError
from cpsim.fuzz import DEFAULT_PATHS
from cpsim.kernels.under_test import to_record
from cpsim.paths import Knobs

REPRO_SCHEMA = "cpsim-repro/1"


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
    ``cpsim.run.host_sizer.Sizer``; None: cpsim's own sizing) gives each host of the scenario. Its
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
             meanwhile: Callable[[], None] | None = None, profile=None, runner=None) -> Outcome:
    """Run the virtual world and the coordinator; an exception is an outcome too.

    ``kernels`` maps a path to the user's kernel (``cpsim.kernels.under_test``) replacing the
    built-in one; ``allocs`` is ``allocate_world(s)`` when the caller has it; ``meanwhile`` is called
    once, before the kernels' results are awaited (fuzz draws the next scenario there and queues its
    kernels behind these). ``profile``: the release profile judging (``cpsim.check.profiles``); a
    scenario its release cannot express is an outcome of its own, neither pass nor failure. ``runner``:
    ``run_virtual``'s."""
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
        gathered = run_virtual(s, paths, knobs, device=device, kernels=kernels, allocs=allocs, runner=runner)
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
    sizing = data.get("sizing") or ""  # checked where it is run (``cpsim.run.host_sizer.Sizer``, field repro.sizing)
    return Repro(s, list(data.get("paths") or DEFAULT_PATHS), knobs, data.get("inject"),
                 data.get("violation", {}), kernels, profile=profile, sizing=sizing)



def replay(r: Repro, device: str = "cpu", kernels: dict | None = None, sizer=None, runner=None) -> Outcome:
    """Rerun a repro in the virtual world with the knobs it recorded.

    ``kernels``: the loaded kernels under test (``cpsim replay`` loads the recorded ones,
    ``kernel_under_test.from_record(r.kernels)``, with command-line overrides); ``sizer``: the host
    sizing under test (``cpsim.run.host_sizer.Sizer``; ``cpsim replay`` builds it from ``r.sizing`` or
    ``--sizing``), asked for the scenario as the profile lays it out; ``runner``: ``run_virtual``'s."""
    prof = profiles.get(r.profile) if r.profile else profiles.for_abis([k.abi for k in (kernels or {}).values()])
    return evaluate(r.scenario, r.paths, sized(r.knobs, sizer, r.paths), device, kernels, profile=prof,
                    runner=runner)

"""cpsim inside a user's own pytest run.

``check_kernel(kernel, ...)`` runs cpsim's invariant suite on a kernel and raises
AssertionError with the violation report. As a pytest plugin (entry point
``pytest11``), ``pytest --cpsim-kernel-v1 SPEC`` / ``--cpsim-kernel-v2 SPEC``
adds one generated test per scenario. Without those options the plugin adds
nothing and imports nothing heavy: it is loaded by every pytest run in the
environment, cpsim's own included.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any, Iterable

import pytest

# Small scenarios: the Triton interpreter costs milliseconds per program.
DEFAULT_SCENARIOS = ("default", "hybrid-mamba", "mtp", "random:1", "random:2", "random:3")
OPTIONS = {"v1": "cpsim_kernel_v1", "v1-fused": "cpsim_kernel_v1_fused", "v2": "cpsim_kernel_v2"}


def scenario(spec: Any):
    """A Scenario from a preset name, a .json/.toml file, ``random:SEED``, or a Scenario."""
    from cpsim import scenario as sc
    from cpsim.presets import PRESETS, preset
    from cpsim.random_scenarios import random_scenario
    from cpsim.errors import ConfigError
    from cpsim.validate import load_scenario
    if isinstance(spec, sc.Scenario):
        return spec
    text = str(spec)
    if text in PRESETS:
        return preset(text)
    if text.startswith("random:") and text[7:].isdigit():
        return random_scenario(int(text[7:]), max_world=4, max_groups=3, max_reqs=4, max_model_len=4096)
    if Path(text).suffix in (".json", ".toml"):
        return sc.validate(load_scenario(text))
    raise ConfigError("scenarios", f"{text!r} is not a preset ({', '.join(PRESETS)}), random:SEED, "
                                   f"nor a .json/.toml file")


def _for_path(s, path: str):
    """The v1-fused path exists at CP size 1 only: run the scenario there at CP 1."""
    if path != "v1-fused" or s.cp.world == 1:
        return s
    from cpsim.scenario import CPConfig
    return s.replace(name=f"{s.name}@cp1", cp=CPConfig())


def judged_by(kernel, profile: str | None = None):
    """The named release profile (exit-2 ConfigError if unknown), else the kernel's release (cpsim's own)."""
    from cpsim.check import profiles
    return profiles.get(profile) if profile else profiles.for_abis([getattr(kernel, "abi", "builtin")])


def report_text(s, verdicts, kernel=None, profile=None) -> str:
    from rich.console import Console

    from cpsim.report import report
    buf = io.StringIO()
    console = Console(file=buf, width=120, color_system=None, soft_wrap=True)
    report.print_report(console, s, verdicts)
    if profile is not None:
        console.print(f"profile: {profile.name} ({profile.releases})", highlight=False)
    if kernel is not None:
        console.print(f"kernel under test: {kernel.describe()}", highlight=False)
        for note in kernel.notes:
            console.print(f"  note: {note}", highlight=False)
    return buf.getvalue()


def run_one(kernel, path: str, s, device: str = "cpu", profile=None, sizer=None):
    """Verdicts of one scenario for a loaded kernel on one path, judged by ``profile`` (a
    ``cpsim.check.profiles.Profile``; default: the kernel's release), which lays the scenario out too.
    ``sizer``: the host sizing under test (``cpsim.run.sizing.Sizer``; its function runs in a child
    process); a function that fails is an AssertionError naming it."""
    from cpsim.check import coordinator, profiles
    from cpsim.allocator import allocate_world
    from cpsim.paths import Knobs
    from cpsim.run import isolation
    from cpsim.run.world import run_virtual
    prof = profile or judged_by(kernel)
    s = profiles.scenario_for(_for_path(s, path), prof)
    knobs = Knobs()
    if sizer is not None:
        from cpsim.run.sizing import SizingFailure
        try:
            knobs = Knobs(host_sizing=sizer.answer(s, [path]))
        except SizingFailure as e:
            raise AssertionError(f"host sizing on scenario {s.name}: {e}") from None
    try:
        gathered = run_virtual(s, [path], knobs, device=device, kernels={path: kernel})
    finally:  # what a worker the kernel killed left behind ends with the check (cpsim.run.reaper)
        isolation.sweep_escaped()
    return s, coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world, prof)


def exercised(verdicts) -> bool:
    """At least one group's slots were compared with the reference (not a vacuous pass)."""
    return any(v.invariant == "matches-reference" and v.status == "pass" for v in verdicts)


def load_kernel(kernel: Any, path: str | None = None, abi: str = "auto", *, shim_vllm: bool = False,
                device: str = "cpu", v2_launch: str = "split"):
    """A KernelUnderTest from a SPEC string, a kernel object or an already loaded one.

    A SPEC is imported in a kernel worker (``cpsim.run.isolation.probe``), never in the test's own
    process; ``path`` None: the first path its ABI stands in for. An import that raises, exits,
    hangs or crashes fails the test, naming the file."""
    from cpsim.kernels.under_test import KernelUnderTest, load
    from cpsim.run import isolation
    if isinstance(kernel, KernelUnderTest):
        return kernel
    k = load(kernel, path, abi, shim_vllm=shim_vllm, device=device, v2_launch=v2_launch, where="kernel",
             inspect=isolation.probe)
    if k.failed is not None:
        raise AssertionError(f"{k.spec}: kernel {k.failed.message}")
    return k


def check_kernel(kernel: Any, abi: str = "auto", path: str | None = None,
                 scenarios: Iterable[Any] | None = None, *, shim_vllm: bool = False, device: str = "cpu",
                 v2_launch: str = "split", profile: str | None = None, sizing: str | None = None) -> dict:
    """Run every invariant on ``kernel``; AssertionError with the report if any fails.

    ``path`` defaults to the path the ABI stands in for (v1 for a callable; a replay-padding kernel
    runs after cpsim's slot mapping on v1 and v2, or on ``path``);
    ``scenarios`` are presets, .json/.toml files, ``random:SEED`` or Scenario
    objects; ``profile`` names the release profile judging (default: the kernel's release);
    ``sizing`` a host sizing SPEC (as ``--sizing``) whose widths and buffer the tables get.
    Returns {scenario name: verdicts} when everything holds.
    """
    from cpsim.check import coordinator
    k = load_kernel(kernel, None, abi, shim_vllm=shim_vllm, device=device, v2_launch=v2_launch)
    if "replay" in _paths_of(k.abi):  # a replay-padding kernel runs after the slot mappings of a path
        return _check_replay(k, path, scenarios, device)
    if path is not None:
        k = load_kernel(kernel, path, abi, shim_vllm=shim_vllm, device=device, v2_launch=v2_launch)
    path = path or next(p for p in ("v1", "v1-fused", "v2") if p in _paths_of(k.abi))
    prof = judged_by(k, profile)
    results, failures = {}, []
    from cpsim.run.sizing import Sizer
    with (Sizer(sizing) if sizing else contextlib.nullcontext()) as sizer:
        for spec in (DEFAULT_SCENARIOS if scenarios is None else scenarios):
            s, verdicts = run_one(k, path, scenario(spec), device, prof, sizer)
            results[s.name] = verdicts
            if not coordinator.passed(verdicts):
                failures.append(report_text(s, verdicts, k, prof))
    if failures:
        raise AssertionError(f"{k.describe()} on the {path} path violates cpsim invariants in "
                             f"{len(failures)} scenario(s):\n\n" + "\n".join(failures))
    if results and not any(exercised(v) for v in results.values()):
        raise AssertionError(f"{k.describe()}: no scenario had a group this kernel could be checked on "
                             f"({'; '.join(k.notes) or 'no slot-mapped groups'})")
    return results


# Scenarios where requests replay: the preset and small random ones (random_scenario's replay draws).
REPLAY_SCENARIOS = ("prefix-replay", "random:53", "random:162", "random:188")


def _check_replay(k, path: str | None, scenarios, device: str) -> dict:
    """A replay-padding kernel (``--kernel-replay``): run after cpsim's slot mapping on v1 and v2 (or on
    ``path``); at least one scenario must replay, or nothing was checked."""
    from cpsim.check import coordinator
    from cpsim.kernels.under_test import with_replay
    runner = with_replay(None, k)
    results, failures = {}, []
    for spec in (REPLAY_SCENARIOS if scenarios is None else scenarios):
        for p in ([path] if path and path != "replay" else ["v1", "v2"]):
            s, verdicts = run_one(runner, p, scenario(spec), device)
            results[f"{s.name}/{p}"] = verdicts
            if not coordinator.passed(verdicts):
                failures.append(report_text(s, verdicts, runner))
    if failures:
        raise AssertionError(f"{runner.describe()} violates cpsim invariants in {len(failures)} run(s):\n\n"
                             + "\n".join(failures))
    if not any(v.invariant == "replayed-is-pad" and v.status == "pass" for vs in results.values() for v in vs):
        raise AssertionError(f"{runner.describe()}: no scenario replays, so the kernel was never run")
    return results


def _paths_of(abi: str) -> tuple[str, ...]:
    from cpsim.kernels.under_test import ABIS
    return ABIS[abi].paths


# ---- pytest plugin -------------------------------------------------------------

def pytest_addoption(parser) -> None:
    g = parser.getgroup("cpsim", "cpsim: check a slot-mapping kernel against the CP invariants")
    g.addoption("--cpsim-kernel-v1", metavar="SPEC", help="kernel for cpsim's v1 path (module:attr or file.py:attr)")
    g.addoption("--cpsim-kernel-v1-fused", metavar="SPEC", help="kernel for cpsim's v1-fused path")
    g.addoption("--cpsim-kernel-v2", metavar="SPEC", help="kernel for cpsim's v2 path")
    g.addoption("--cpsim-kernel-abi", default="auto", help="calling convention (default: auto)")
    g.addoption("--cpsim-scenarios", default=",".join(DEFAULT_SCENARIOS),
                help="comma-separated presets, .json/.toml files or random:SEED")
    g.addoption("--cpsim-device", default="cpu", help="torch device for the kernels (cpu = Triton interpreter)")
    g.addoption("--cpsim-shim-vllm", action="store_true", help="provide vllm.triton_utils/_load_ptr from Triton")
    g.addoption("--cpsim-profile", metavar="NAME",
                help="release profile the oracle judges by (default: the kernel's release; docs/SPEC.md §4.1)")
    g.addoption("--cpsim-sizing", metavar="SPEC",
                help="host sizing under test, as cpsim --sizing (a built-in release or file.py:fn; run in a child process)")
    g.addoption("--cpsim-v2-launch", default="split", choices=("split", "single"),
                help="v2 ABIs: launch unsharded groups with CP_SIZE=1 (split) or all groups at once (single)")


def pytest_unconfigure(config) -> None:
    """The session's end: processes that dead workers' kernels left are ended (by their marker,
    ``cpsim.run.reaper``); the live workers and their subtrees end when this process exits. Nothing
    is imported when no check ran."""
    import sys
    isolation = sys.modules.get("cpsim.run.isolation")
    if isolation is not None:
        isolation.sweep_escaped()


class CpsimKernelItem(pytest.Item):
    """One scenario of cpsim's invariant suite on the user's kernel."""

    def __init__(self, *, path: str, spec: str, scenario_spec: str, **kw):
        super().__init__(**kw)
        self.kernel_path, self.spec, self.scenario_spec = path, spec, scenario_spec

    def _kernel(self):
        cache = self.config.stash.setdefault(_KERNELS, {})
        if self.kernel_path not in cache:
            opt = self.config.getoption
            cache[self.kernel_path] = load_kernel(
                self.spec, self.kernel_path, opt("cpsim_kernel_abi"), shim_vllm=opt("cpsim_shim_vllm"),
                device=opt("cpsim_device"), v2_launch=opt("cpsim_v2_launch"))
        return cache[self.kernel_path]

    def _sizer(self):
        """One sizing child for every generated item (ended when cpsim's process exits)."""
        spec = self.config.getoption("cpsim_sizing")
        if not spec:
            return None
        cache = self.config.stash.setdefault(_KERNELS, {})
        if ("sizing", spec) not in cache:
            from cpsim.run.sizing import Sizer
            cache[("sizing", spec)] = Sizer(spec)
        return cache[("sizing", spec)]

    def runtest(self) -> None:
        from cpsim.check import coordinator
        k = self._kernel()
        prof = judged_by(k, self.config.getoption("cpsim_profile"))
        self.user_properties.append(("cpsim_profile", prof.name))
        s, verdicts = run_one(k, self.kernel_path, scenario(self.scenario_spec), self.config.getoption("cpsim_device"),
                              prof, self._sizer())
        if not coordinator.passed(verdicts):
            raise AssertionError(report_text(s, verdicts, k, prof))
        if not exercised(verdicts):
            pytest.skip(f"no group of scenario {s.name} can be checked with the {k.abi} ABI")

    def repr_failure(self, excinfo, style=None):
        from cpsim.errors import ConfigError
        if isinstance(excinfo.value, (AssertionError, ConfigError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        prof = self.config.getoption("cpsim_profile")
        return self.spec, None, f"cpsim {self.kernel_path} {self.scenario_spec}" + (f" profile {prof}" if prof else "")


_KERNELS = pytest.StashKey[dict]()


class CpsimCollector(pytest.Collector):
    """Parent of the generated items, so their ids read ``cpsim::v1[mtp]``."""

    def collect(self):
        return []


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection, so those apply to our items too
def pytest_collection_modifyitems(session, config, items) -> None:
    given = {path: config.getoption(opt) for path, opt in OPTIONS.items() if config.getoption(opt)}
    if not given:
        return
    scenarios = [x.strip() for x in config.getoption("cpsim_scenarios").split(",") if x.strip()]
    parent = CpsimCollector.from_parent(session, name="cpsim", nodeid="cpsim")
    for path, spec in given.items():
        for sc_spec in scenarios:
            items.append(CpsimKernelItem.from_parent(parent, name=f"{path}[{sc_spec}]", path=path,
                                                     spec=spec, scenario_spec=sc_spec))

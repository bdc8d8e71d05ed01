"""``check_kernel``: cpsim's invariant suite on a user's kernel, from their own test or script.

Raises AssertionError with the violation report; the pytest plugin (:mod:`cpsim.plugin.testing`) runs the
same functions, one generated test per scenario.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any, Iterable

from rich.console import Console

from cpsim import scenario as sc
from cpsim.check import profiles
from cpsim.errors import ConfigError
from cpsim.kernels.under_test import ABIS, KernelUnderTest, load, with_replay
from cpsim.presets import PRESETS, preset
from cpsim.random_scenarios import random_scenario
from cpsim.run.host_sizer import Sizer, SizingFailure
from cpsim.validate import load_scenario

# Small scenarios: the Triton interpreter costs milliseconds per program.
DEFAULT_SCENARIOS = ("default", "hybrid-mamba", "mtp", "random:1", "random:2", "random:3")


def scenario(spec: Any):
    """A Scenario from a preset name, a .json/.toml file, ``random:SEED``, or a Scenario."""
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
    return s.replace(name=f"{s.name}@cp1", cp=sc.CPConfig())


def judged_by(kernel, profile: str | None = None):
    """The named release profile (exit-2 ConfigError if unknown), else the kernel's release (cpsim's own)."""
    return profiles.get(profile) if profile else profiles.for_abis([getattr(kernel, "abi", "builtin")])


def report_text(s, verdicts, kernel=None, profile=None) -> str:
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


def run_one(kernel, path: str, s, device: str = "cpu", profile=None, sizer=None, runner=None):
    """Verdicts of one scenario for a loaded kernel on one path, judged by ``profile`` (a
    ``cpsim.check.profiles.Profile``; default: the kernel's release), which lays the scenario out too.
    ``sizer``: the host sizing under test (``cpsim.run.host_sizer.Sizer``; its function runs in a child
    process); a function that fails is an AssertionError naming it. ``runner``: the ``KernelRunner``
    the kernel runs on (keep one across calls: its workers stay warm; none: one of this call's own)."""
    from cpsim.check import coordinator
    from cpsim.allocator import allocate_world
    from cpsim.paths import Knobs
    from cpsim.run.runner import given
    from cpsim.run.world import run_virtual
    prof = profile or judged_by(kernel)
    s = profiles.scenario_for(_for_path(s, path), prof)
    knobs = Knobs()
    if sizer is not None:
        try:
            knobs = Knobs(host_sizing=sizer.answer(s, [path]))
        except SizingFailure as e:
            raise AssertionError(f"host sizing on scenario {s.name}: {e}") from None
    with given(runner) as r:
        try:
            gathered = run_virtual(s, [path], knobs, device=device, kernels={path: kernel}, runner=r)
        finally:  # what a worker the kernel killed left behind ends with the check (cpsim.run.reaper)
            r.sweep_escaped()
    return s, coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world, prof)


def exercised(verdicts) -> bool:
    """At least one group's slots were compared with the reference (not a vacuous pass)."""
    return any(v.invariant == "matches-reference" and v.status == "pass" for v in verdicts)


def load_kernel(kernel: Any, path: str | None = None, abi: str = "auto", *, shim_vllm: bool = False,
                device: str = "cpu", v2_launch: str = "split", runner=None):
    """A KernelUnderTest from a SPEC string, a kernel object or an already loaded one.

    A SPEC is imported in a worker of ``runner`` (``KernelRunner.probe``; none: one of this call's own),
    never in the test's own process; ``path`` None: the first path its ABI stands in for. An import
    that raises, exits, hangs or crashes fails the test, naming the file."""
    from cpsim.run.runner import given
    if isinstance(kernel, KernelUnderTest):
        return kernel
    with given(runner) as r:
        k = load(kernel, path, abi, shim_vllm=shim_vllm, device=device, v2_launch=v2_launch, where="kernel",
                 inspect=r.probe)
    if k.failed is not None:
        raise AssertionError(f"{k.spec}: kernel {k.failed.message}")
    return k


def check_kernel(kernel: Any, abi: str = "auto", path: str | None = None,
                 scenarios: Iterable[Any] | None = None, *, shim_vllm: bool = False, device: str = "cpu",
                 v2_launch: str = "split", profile: str | None = None, sizing: str | None = None,
                 runner=None) -> dict:
    """Run every invariant on ``kernel``; AssertionError with the report if any fails.

    ``path`` defaults to the path the ABI stands in for (v1 for a callable; a replay-padding kernel
    runs after cpsim's slot mapping on v1 and v2, or on ``path``);
    ``scenarios`` are presets, .json/.toml files, ``random:SEED`` or Scenario
    objects; ``profile`` names the release profile judging (default: the kernel's release);
    ``sizing`` a host sizing SPEC (as ``--sizing``) whose widths and buffer the tables get;
    ``runner`` the ``KernelRunner`` the kernel is read and run by (keep one across checks: its workers
    stay warm; none: one of this check's own, ended when it returns).
    Returns {scenario name: verdicts} when everything holds.
    """
    from cpsim.run.runner import given
    with given(runner) as r:
        return _check_kernel(kernel, abi, path, scenarios, shim_vllm, device, v2_launch, profile, sizing, r)


def _check_kernel(kernel, abi, path, scenarios, shim_vllm, device, v2_launch, profile, sizing, runner) -> dict:
    from cpsim.check import coordinator
    k = load_kernel(kernel, None, abi, shim_vllm=shim_vllm, device=device, v2_launch=v2_launch, runner=runner)
    if "replay" in _paths_of(k.abi):  # a replay-padding kernel runs after the slot mappings of a path
        return _check_replay(k, path, scenarios, device, runner)
    if path is not None:
        k = load_kernel(kernel, path, abi, shim_vllm=shim_vllm, device=device, v2_launch=v2_launch, runner=runner)
    path = path or next(p for p in ("v1", "v1-fused", "v2") if p in _paths_of(k.abi))
    prof = judged_by(k, profile)
    results, failures = {}, []
    with (Sizer(sizing) if sizing else contextlib.nullcontext()) as sizer:
        for spec in (DEFAULT_SCENARIOS if scenarios is None else scenarios):
            s, verdicts = run_one(k, path, scenario(spec), device, prof, sizer, runner)
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


def _check_replay(k, path: str | None, scenarios, device: str, kernel_runner) -> dict:
    """A replay-padding kernel (``--kernel-replay``): run after cpsim's slot mapping on v1 and v2 (or on
    ``path``); at least one scenario must replay, or nothing was checked."""
    from cpsim.check import coordinator
    runner = with_replay(None, k)
    results, failures = {}, []
    for spec in (REPLAY_SCENARIOS if scenarios is None else scenarios):
        for p in ([path] if path and path != "replay" else ["v1", "v2"]):
            s, verdicts = run_one(runner, p, scenario(spec), device, runner=kernel_runner)
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
    return ABIS[abi].paths

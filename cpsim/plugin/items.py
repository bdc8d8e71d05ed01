"""The tests the pytest plugin generates: one item per scenario of cpsim's suite on the user's kernel.

Loaded by :mod:`cpsim.plugin.testing` only when a ``--cpsim-kernel-*`` option is given.
"""

from __future__ import annotations

import pytest

from cpsim.errors import ConfigError
from cpsim.plugin.check import DEFAULT_SCENARIOS, judged_by, exercised, load_kernel, report_text, run_one, scenario
from cpsim.run.host_sizer import Sizer


class CpsimKernelItem(pytest.Item):
    """One scenario of cpsim's invariant suite on the user's kernel."""

    def __init__(self, *, path: str, spec: str, scenario_spec: str, **kw):
        super().__init__(**kw)
        self.kernel_path, self.spec, self.scenario_spec = path, spec, scenario_spec

    def _runner(self):
        """One ``KernelRunner`` for every generated item, kept for the session: its workers stay warm."""
        cache = self.config.stash.setdefault(KERNELS, {})
        if "runner" not in cache:
            from cpsim.run.runner import KernelRunner
            cache["runner"] = KernelRunner()
        return cache["runner"]

    def _kernel(self):
        cache = self.config.stash.setdefault(KERNELS, {})
        if self.kernel_path not in cache:
            opt = self.config.getoption
            cache[self.kernel_path] = load_kernel(
                self.spec, self.kernel_path, opt("cpsim_kernel_abi"), shim_vllm=opt("cpsim_shim_vllm"),
                device=opt("cpsim_device"), v2_launch=opt("cpsim_v2_launch"), runner=self._runner())
        return cache[self.kernel_path]

    def _sizer(self):
        """One sizing child for every generated item (ended when cpsim's process exits)."""
        spec = self.config.getoption("cpsim_sizing")
        if not spec:
            return None
        cache = self.config.stash.setdefault(KERNELS, {})
        if ("sizing", spec) not in cache:
            cache[("sizing", spec)] = Sizer(spec)
        return cache[("sizing", spec)]

    def runtest(self) -> None:
        from cpsim.check import coordinator
        k = self._kernel()
        prof = judged_by(k, self.config.getoption("cpsim_profile"))
        self.user_properties.append(("cpsim_profile", prof.name))
        s, verdicts = run_one(k, self.kernel_path, scenario(self.scenario_spec), self.config.getoption("cpsim_device"),
                              prof, self._sizer(), self._runner())
        if not coordinator.passed(verdicts):
            raise AssertionError(report_text(s, verdicts, k, prof))
        if not exercised(verdicts):
            pytest.skip(f"no group of scenario {s.name} can be checked with the {k.abi} ABI")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, (AssertionError, ConfigError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        prof = self.config.getoption("cpsim_profile")
        return self.spec, None, f"cpsim {self.kernel_path} {self.scenario_spec}" + (f" profile {prof}" if prof else "")


KERNELS = pytest.StashKey[dict]()


class CpsimCollector(pytest.Collector):
    """Parent of the generated items, so their ids read ``cpsim::v1[mtp]``."""

    def collect(self):
        return []


def add_items(session, config, items, given: dict[str, str]) -> None:
    """One item per (path, scenario) for the kernels ``given`` ({path: SPEC}), under one ``cpsim`` parent."""
    spec = config.getoption("cpsim_scenarios")
    scenarios = [x.strip() for x in spec.split(",") if x.strip()] if spec else list(DEFAULT_SCENARIOS)
    parent = CpsimCollector.from_parent(session, name="cpsim", nodeid="cpsim")
    for path, kernel_spec in given.items():
        for sc_spec in scenarios:
            items.append(CpsimKernelItem.from_parent(parent, name=f"{path}[{sc_spec}]", path=path,
                                                     spec=kernel_spec, scenario_spec=sc_spec))

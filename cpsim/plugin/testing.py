"""cpsim inside a user's own pytest run: the pytest plugin (entry point ``pytest11``).

``pytest --cpsim-kernel-v1 SPEC`` / ``--cpsim-kernel-v2 SPEC`` adds one generated test per scenario
(:mod:`cpsim.plugin.items`). Without those options the plugin adds nothing and imports nothing of
cpsim: it is loaded by every pytest run in the environment, cpsim's own included, and the checking
code (:mod:`cpsim.plugin.check`) loads numpy and pydantic. ``check_kernel``, ``load_kernel`` and
``run_one`` are still importable from here, loaded on first use.
"""

from __future__ import annotations

from typing import Any

import pytest

OPTIONS = {"v1": "cpsim_kernel_v1", "v1-fused": "cpsim_kernel_v1_fused", "v2": "cpsim_kernel_v2"}
# cpsim.plugin.check's names, at their documented address (``from cpsim.plugin.testing import check_kernel``).
CHECK_NAMES = {"check_kernel", "load_kernel", "run_one", "scenario", "judged_by", "report_text", "exercised",
               "DEFAULT_SCENARIOS", "REPLAY_SCENARIOS"}


def __getattr__(name: str) -> Any:
    """The names of ``CHECK_NAMES``, loaded on first use; anything else pytest probes for (``__path__``,
    ``pytest_plugins``) is missing as on any module, and loads nothing."""
    if name not in CHECK_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from cpsim.plugin import check  # numpy and pydantic: not for a pytest run that checks no kernel
    return getattr(check, name)


def pytest_addoption(parser) -> None:
    g = parser.getgroup("cpsim", "cpsim: check a slot-mapping kernel against the CP invariants")
    g.addoption("--cpsim-kernel-v1", metavar="SPEC", help="kernel for cpsim's v1 path (module:attr or file.py:attr)")
    g.addoption("--cpsim-kernel-v1-fused", metavar="SPEC", help="kernel for cpsim's v1-fused path")
    g.addoption("--cpsim-kernel-v2", metavar="SPEC", help="kernel for cpsim's v2 path")
    g.addoption("--cpsim-kernel-abi", default="auto", help="calling convention (default: auto)")
    g.addoption("--cpsim-scenarios", help="comma-separated presets, .json/.toml files or random:SEED "
                                          "(default: cpsim.plugin.check.DEFAULT_SCENARIOS, small ones)")
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
    is imported when no check ran (no runner was built)."""
    import sys
    items = sys.modules.get("cpsim.plugin.items")
    runner = config.stash.get(items.KERNELS, {}).get("runner") if items is not None else None
    if runner is not None:
        runner.sweep_escaped()


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection, so those apply to our items too
def pytest_collection_modifyitems(session, config, items) -> None:
    given = {path: config.getoption(opt) for path, opt in OPTIONS.items() if config.getoption(opt)}
    if not given:
        return
    from cpsim.plugin.items import add_items  # numpy and pydantic: only once a kernel is given
    add_items(session, config, items, given)

"""The kernel-isolation entry points the other layers call, each on the runner in use
(``cpsim.run.runner.current``): a caller that holds a ``KernelRunner`` calls it directly.

Why kernels run in worker processes, and how: ``cpsim.run.runner``.
"""

from __future__ import annotations

from typing import Callable

from cpsim.paths import KernelFailure, Knobs, RankOutput
from cpsim.run import reaper, runner
from cpsim.run.ahead import DEPTH  # noqa: F401  (re-exported: fuzz keeps as many scenarios drawn ahead)
from cpsim.run.outcome import KernelFailed  # noqa: F401  (re-exported: what the callers catch)
from cpsim.run.runner import DEFAULT_TIMEOUT_S, Isolation  # noqa: F401  (re-exported)
from cpsim.run.worker import pool_size, usable_cores  # noqa: F401  (re-exported)


def configure(timeout_s: float | None = None, process: bool | None = None) -> Isolation:
    return runner.current().configure(timeout_s, process)


def run_paths(s, paths: list[str], allocs: list, device, knobs: list[Knobs], kernels: dict,
              on_rank: Callable[[str, int], None] | None = None) -> dict[str, list | KernelFailure]:
    return runner.current().run_paths(s, paths, allocs, device, knobs, kernels, on_rank)


def run_rank_checked(path: str, s, allocs, rank: int, device, knobs: Knobs = Knobs(), kernel=None
                     ) -> RankOutput | None:
    return runner.current().run_rank_checked(path, s, allocs, rank, device, knobs, kernel)


def probe(spec: str, path: str, shim_vllm: bool, device: str, where: str):
    return runner.current().probe(spec, path, shim_vllm, device, where)


def call(fn: Callable, path: str, kernel, *args, rank: int = 0, device: str = "cpu"):
    return runner.current().call(fn, path, kernel, *args, rank=rank, device=device)


def ahead(s, paths: list[str], allocs: list, device, knobs: list[Knobs], kernels: dict) -> bool:
    return runner.current().ahead(s, paths, allocs, device, knobs, kernels)


def forget_ahead() -> None:
    runner.current().forget_ahead()


def sweep_escaped() -> list[int]:
    """``WorkerPool.sweep_escaped`` of the runner in use (no runner is built for it)."""
    r = runner.installed()
    return [] if r is None else r.sweep_escaped()


def end_workers() -> None:
    """``WorkerPool.end`` of the runner in use, now (a process about to leave by ``os._exit`` or a
    signal: atexit will not run; no runner is built for it)."""
    r = runner.installed()
    if r is not None:
        r.end()
    elif reaper.is_subreaper():
        reaper.end_descendants()

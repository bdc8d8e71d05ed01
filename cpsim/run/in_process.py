"""Rank runs in this process, unprotected (``CPSIM_KERNEL_ISOLATION=0``, a capture): exceptions and
``sys.exit`` still become failures; crashes and hangs are not caught."""

from __future__ import annotations

from cpsim.errors import ConfigError
from cpsim.paths import KernelFailure, Knobs, RankOutput, prep, run_path
from cpsim.run.outcome import KernelFailed, _unloaded, failed, kernel_error


def _in_process(path: str, s, allocs, rank: int, device: str, knobs: Knobs, kernel,
                inputs: prep.PerRank | None = None) -> RankOutput | None:
    """The unprotected way (``CPSIM_KERNEL_ISOLATION=0``, a capture): exceptions and sys.exit still
    become failures; the kernel is imported into this process for it. ``inputs``: the run's
    preparation (a stage's, for a path's ranks in turn); else one made for it alone."""
    if kernel is not None:
        failure = _unloaded(path, kernel, rank, s.cp.world)
        if failure is not None:
            raise KernelFailed(failure)
        from cpsim.kernels.under_test import here
        kernel = here(kernel, device)
        failure = _unloaded(path, kernel, rank, s.cp.world)
        if failure is not None:
            raise KernelFailed(failure)
    inputs = inputs if inputs is not None else prep.PerRank(s, device)
    try:
        return run_path(path, s, allocs, rank, device, knobs, kernel, inputs)
    except ConfigError:
        raise
    except (SystemExit, Exception) as e:  # noqa: BLE001  (the kernel's exception becomes a named violation)
        raise failed(kernel_error(e, kernel, inputs.launching), path, rank, kernel) from None


def _sequential(path: str, s, allocs, device, knobs, kernel, on_rank, ranks, outs: dict | None = None,
                fails: list | None = None) -> list | KernelFailure:
    """Ranks run here in turn, stopping at the first that fails. With ``outs`` / ``fails`` given,
    fills them (a chunk of ``run_paths``); else returns the path's result."""
    got: dict = {} if outs is None else outs
    stage = prep.for_ranks(s, {r: allocs[r] for r in ranks}, device, builtin=kernel is None)
    for r in ranks:
        try:
            got[r] = _in_process(path, s, allocs[r], r, device, knobs[r], kernel, stage.for_rank(r))
        except KernelFailed as e:
            if fails is not None:
                fails.append(e.failure)
                return e.failure
            e.failure.not_run = list(range(r + 1, s.cp.world))
            return e.failure
        if on_rank is not None:
            on_rank(path, r)
    return [got[r] for r in ranks]


def probe_here(spec: str, path: str, shim_vllm: bool, device: str, where: str):
    """``KernelRunner.probe`` with isolation off: the kernel is imported into this process."""
    from cpsim.kernels.under_test import KernelImportError, inspect_here
    try:
        return inspect_here(spec, path, shim_vllm, device, where)
    except KernelImportError as e:
        return e.failure


def call_here(fn, path: str, kernel, args: tuple, rank: int, device: str):
    """``KernelRunner.call`` with isolation off: ``fn(kernel, *args)`` in this process."""
    from cpsim.kernels.under_test import here
    k = here(kernel, device)
    failure = _unloaded(path, k, rank, 1)
    if failure is not None:
        raise KernelFailed(failure)
    try:
        return fn(k, *args)
    except ConfigError:
        raise
    except (SystemExit, Exception) as e:  # noqa: BLE001  (the kernel's exception becomes a named violation)
        raise failed(kernel_error(e, k), path, rank, kernel) from None

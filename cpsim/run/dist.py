"""Processes, devices and collectives for runs under ``torchrun``.

One process per device (or several per device with ``--oversubscribe``). Every
collective here is bounded: it is started asynchronously and polled, so a rank
that raised, died or never arrived is noticed and named instead of hanging the
job. Liveness goes through the rendezvous store, which torchrun's agent hosts
and which therefore outlives any single worker:

- ``cpsim/hb/<rank>``: a counter a daemon thread bumps every ``HEARTBEAT_S``;
- ``cpsim/state/<rank>``: what the rank is doing (``FINAL`` states end a rank);
- ``cpsim/seq/<rank>``: how many collectives the rank has entered.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import torch

from cpsim.errors import ConfigError, DistError
from cpsim.run.torchrun_env import DEVICES, launched_by_torchrun  # noqa: F401  (re-exported)

HEARTBEAT_S = 0.5
FINAL = ("done", "failed", "aborted", "terminated")


@dataclass(frozen=True)
class Env:
    rank: int
    world: int
    local_rank: int
    local_world: int

    @staticmethod
    def from_environ() -> "Env":
        try:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            local = int(os.environ.get("LOCAL_RANK", rank))
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        except (KeyError, ValueError) as e:
            raise ConfigError("environment", f"RANK / WORLD_SIZE / LOCAL_RANK are not set to integers ({e})") from None
        return Env(rank, world, local, local_world)


# ---- bad input before any process group ----------------------------------------------

EARLY_BOUND_S = 60.0  # how long ranks wait for each other on bad input when --timeout itself is unusable


def _agent_store(timeout_s: float):
    """A client of the store torchrun's agent hosts (None when the launcher has none)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    from torch.distributed import TCPStore
    try:
        return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                        timeout=timedelta(seconds=timeout_s))
    except Exception:  # no store to reach: end alone
        return None


def end_on_bad_input(message: str, timeout_s: float | None, code: int = 2,
                     before_exit: Callable[[], None] | None = None) -> int:
    """Under torchrun, end every rank on the same bad input together, printing it once.

    Never returns under torchrun's agent; returns ``code`` elsewhere (RANK / WORLD_SIZE set by
    another launcher or a test), leaving the printing to the caller.

    Bad input is found before any process group exists, on every rank alike (they parse the same
    command line). Left alone, the first rank to exit makes torchrun SIGTERM the others, maybe
    before rank 0 has printed anything, and they end with -15 instead of 2. Instead each rank
    counts itself in through the agent's store and waits (bounded) for the others; rank 0
    prints the message, another rank only a message that differs from rank 0's. ``before_exit``: as
    ``_leave``'s ``before``.
    """
    try:
        env = Env.from_environ()
    except ConfigError:  # RANK / WORLD_SIZE are not torchrun's
        return code
    bound = timeout_s if timeout_s is not None and 0 < timeout_s < math.inf else EARLY_BOUND_S
    store = _agent_store(bound)
    if store is None:  # not under torchrun's agent: the caller prints and returns as usual
        return code
    signal.signal(signal.SIGTERM, lambda *_: _leave(code, before_exit))  # a peer already left with the same code
    store.set(f"cpsim/early/msg/{env.rank}", message)
    end = time.monotonic() + bound
    if env.rank == 0:
        print(message, file=sys.stderr, flush=True)
    else:
        first = None
        while first is None and time.monotonic() < end:
            first = store.get("cpsim/early/msg/0").decode() if store.check(["cpsim/early/msg/0"]) else None
            time.sleep(0.05)
        if first != message:
            print(f"[rank {env.rank}] {message}", file=sys.stderr, flush=True)
    store.add("cpsim/early/count", 1)
    while int(store.add("cpsim/early/count", 0)) < env.world and time.monotonic() < end:
        time.sleep(0.05)
    _leave(code, before_exit)


# ---- devices -------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceChoice:
    kind: str                  # npu | cuda | cpu
    device: torch.device       # where this rank's kernels run
    backend: str               # default process group: hccl | nccl | gloo
    oversubscribed: bool       # ranks share devices; collectives on host copies

    @property
    def comm_device(self) -> torch.device:
        """Where collective buffers live: the device for hccl/nccl, the host for gloo."""
        return self.device if self.backend in ("hccl", "nccl") else torch.device("cpu")

    def describe(self) -> str:
        extra = ", oversubscribed" if self.oversubscribed else ""
        return f"{self.device} ({self.backend}{extra})"


def _npu_module():
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError:
        return None
    return getattr(torch, "npu", None)


def _accelerator(kind: str):
    """(module, device count) for npu/cuda; ConfigError when it cannot be used."""
    if kind == "npu":
        mod = _npu_module()
        if mod is None:
            raise ConfigError("--device", "device npu requested but torch_npu is not importable "
                                          "(install torch-npu matching your torch, or pick --device cuda/cpu)")
    else:
        mod = torch.cuda
        if not torch.cuda.is_available():
            raise ConfigError("--device", "device cuda requested but torch.cuda.is_available() is False "
                                          f"(torch {torch.__version__}; check the driver and CUDA_VISIBLE_DEVICES)")
    count = mod.device_count() if mod.is_available() else 0
    if count == 0:
        env = "ASCEND_RT_VISIBLE_DEVICES" if kind == "npu" else "CUDA_VISIBLE_DEVICES"
        raise ConfigError("--device", f"device {kind} requested but no {kind} device is visible (check {env})")
    return mod, count


def resolve_kind(requested: str) -> str:
    if requested != "auto":
        return requested
    mod = _npu_module()
    if mod is not None and mod.is_available() and mod.device_count() > 0:
        return "npu"
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return "cuda"
    return "cpu"


def select_device(requested: str, local_rank: int = 0, local_world: int = 1,
                  oversubscribe: bool = False) -> DeviceChoice:
    """Pick this rank's device and backend; set the current device; never imports triton."""
    if requested not in DEVICES:
        raise ConfigError("--device", f"unknown device {requested!r}; choose from {', '.join(DEVICES)}")
    kind = resolve_kind(requested)
    if kind == "cpu":
        from cpsim.kernels import use_interpreter
        use_interpreter()
        return DeviceChoice("cpu", torch.device("cpu"), "gloo", False)
    mod, count = _accelerator(kind)
    shared = local_world > count
    if shared and not oversubscribe:
        raise ConfigError("--oversubscribe", f"{local_world} ranks on this node but only {count} {kind} "
                                             f"device(s); pass --oversubscribe to share them")
    index = local_rank % count
    mod.set_device(index)
    backend = "gloo" if shared else ("hccl" if kind == "npu" else "nccl")
    if backend == "nccl" and not torch.distributed.is_nccl_available():
        raise ConfigError("--device", "device cuda needs the nccl backend, which this torch build lacks "
                                      "(or pass --oversubscribe to use gloo)")
    return DeviceChoice(kind, torch.device(kind, index), backend, shared)


# ---- failures --------------------------------------------------------------------

class Terminated(BaseException):
    """SIGTERM from the launcher (it stops every worker once one of them failed)."""


class PeerFailure(DistError):
    """Another rank raised, died or never arrived: this rank stops too. ``ranks`` are the ranks it names
    as the cause (rank 0's report of the stop lists them)."""

    def __init__(self, message: str, ranks: list[int] | None = None):
        super().__init__(message)
        self.ranks = sorted(set(ranks or []))


def _leave(code: int, before: Callable[[], None] | None = None):
    """End the process now with ``code``: a process group with a collective in flight can block in
    its destructor, and a peer that left first makes the launcher signal the rest. ``before``: what must
    end first, as ``os._exit`` skips atexit (the kernel runner's workers, ``KernelRunner.end``)."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:  # a closed pipe: nothing more to say
            pass
    if before is not None:
        before()
    os._exit(code)


# ---- HCCL ---------------------------------------------------------------------------

HCCL_CONNECT_RANGE = (120, 7200)   # CANN: integer seconds, default 120
HCCL_EXEC_RANGE = (68, 17340)      # CANN: seconds, applied as value // 68 * 68
HCCL_MARGIN_S = 10                 # cpsim's own bound fires first and names the peer


def hccl_env(timeout_s: float, environ: dict | None = None) -> dict[str, str]:
    """HCCL_CONNECT_TIMEOUT / HCCL_EXEC_TIMEOUT derived from ``--timeout``, for those the user did not set.

    HCCL's own limits default to 120 s (connect) and about 30 min (exec), so a dead peer would
    surface as a raw HCCL error or not at all within ``--timeout``. Both are set a little above
    ``--timeout`` (cpsim's poll names the peer first) and clamped to the ranges CANN accepts;
    the exec value is rounded up to a multiple of 68 because HCCL rounds it down to one.
    """
    environ = os.environ if environ is None else environ
    want = math.ceil(timeout_s) + HCCL_MARGIN_S
    lo, hi = HCCL_CONNECT_RANGE
    out = {"HCCL_CONNECT_TIMEOUT": str(min(max(want, lo), hi))}
    lo, hi = HCCL_EXEC_RANGE
    out["HCCL_EXEC_TIMEOUT"] = str(min(max(math.ceil(want / 68) * 68, lo), hi // 68 * 68))
    return {k: v for k, v in out.items() if not environ.get(k, "").strip()}


def check_timeout(timeout_s: float) -> None:
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ConfigError("--timeout", f"must be a finite number of seconds > 0, got {timeout_s:g}")

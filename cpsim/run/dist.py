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

import argparse
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch

from cpsim.errors import ConfigError, DistError

DEVICES = ("auto", "npu", "cuda", "cpu")
DEFAULT_TIMEOUT_S = 300.0
HEARTBEAT_S = 0.5
FINAL = ("done", "failed", "aborted", "terminated")


def add_dist_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("devices and torchrun")
    g.add_argument("--device", choices=DEVICES, default="auto",
                   help="where kernels run: auto picks npu, then cuda, then cpu (default: auto)")
    g.add_argument("--oversubscribe", action="store_true",
                   help="allow more ranks than devices on a node: kernels share the devices, "
                        "collectives go through gloo on host copies")
    g.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"bound on process-group init and on every collective (default: {DEFAULT_TIMEOUT_S:g})")


def launched_by_torchrun() -> bool:
    """torchrun (and any env:// launcher) exports RANK and WORLD_SIZE to each worker."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


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
    """Another rank raised, died or never arrived: this rank stops too."""


_TERMINATED = threading.Event()


def _on_sigterm(signum, frame):
    # Raised wherever the main thread is (an import may wrap it); Comm.fail checks the flag.
    _TERMINATED.set()
    raise Terminated()


# ---- the communicator --------------------------------------------------------------

class Comm:
    """The initialised world: bounded collectives plus the liveness protocol."""

    def __init__(self, env: Env, dev: DeviceChoice, timeout_s: float):
        self.env = env
        self.rank, self.world = env.rank, env.world
        self.dev = dev
        self.timeout_s = timeout_s
        self.stale_s = min(30.0, max(8.0, timeout_s / 4))
        self.seq = 0
        self._groups: dict[int, tuple[int, object]] = {}
        self._stop = threading.Event()
        self._beat_error: BaseException | None = None
        self._seen: dict[int, tuple[int, float]] = {}

    # -- setup / teardown
    @staticmethod
    def init(env: Env, dev: DeviceChoice, timeout_s: float) -> "Comm":
        import torch.distributed as dist
        if timeout_s <= 0:
            raise ConfigError("--timeout", f"must be > 0 seconds, got {timeout_s:g}")
        c = Comm(env, dev, timeout_s)
        try:
            dist.init_process_group(dev.backend, timeout=timedelta(seconds=timeout_s))
        except Exception as e:  # a missing rank surfaces here as a store timeout
            raise DistError(f"rank {env.rank}: init_process_group({dev.backend}) did not complete within "
                            f"{timeout_s:g} s: {e}") from e
        c.store = dist.distributed_c10d._get_default_store()
        # Object traffic and fingerprints always go through gloo on the host.
        c.ctrl = None if dev.backend == "gloo" else dist.new_group(backend="gloo",
                                                                   timeout=timedelta(seconds=timeout_s))
        c.state("started")
        c.store.add(f"cpsim/hb/{c.rank}", 1)
        threading.Thread(target=c._beat, name="cpsim-heartbeat", daemon=True).start()
        signal.signal(signal.SIGTERM, _on_sigterm)
        return c

    def _beat(self) -> None:
        key = f"cpsim/hb/{self.rank}"
        try:
            while not self._stop.wait(HEARTBEAT_S):
                self.store.add(key, 1)
        except Exception as e:  # the store went away: the peers will see this rank as silent
            self._beat_error = e

    def close(self) -> None:
        import torch.distributed as dist
        self.state("done")
        self._stop.set()
        dist.destroy_process_group()

    # -- store protocol
    def state(self, text: str) -> None:
        self.store.set(f"cpsim/state/{self.rank}", text[:500])

    def states(self) -> dict[int, str]:
        keys = [f"cpsim/state/{r}" for r in range(self.world)]
        out = {}
        for r, k in enumerate(keys):
            out[r] = self.store.get(k).decode() if self.store.check([k]) else "not started"
        return out

    def _beats(self) -> dict[int, int]:
        return {r: int(self.store.add(f"cpsim/hb/{r}", 0)) for r in range(self.world)}

    def _seqs(self) -> dict[int, int]:
        return {r: int(self.store.add(f"cpsim/seq/{r}", 0)) for r in range(self.world)}

    @staticmethod
    def _final(state: str) -> bool:
        return state.split(":")[0] in FINAL

    def _check_peers(self) -> None:
        """Raise PeerFailure if a peer reported a failure or its heartbeat went silent."""
        states = self.states()
        now = time.monotonic()
        for r, st in states.items():
            if r != self.rank and st.split(":")[0] in ("failed", "aborted"):
                raise PeerFailure(f"rank {r} {st}")
        for r, n in self._beats().items():
            last = self._seen.get(r)
            if last is None or last[0] != n:
                self._seen[r] = (n, now)
            elif r != self.rank and now - last[1] > self.stale_s and not self._final(states[r]):
                raise PeerFailure(f"rank {r} is gone: no heartbeat for {now - last[1]:.0f} s "
                                  f"(last state: {states[r]!r})")

    def diagnose(self, window_s: float = 3.0) -> str:
        """Name the ranks that are gone: not finished and silent for ``window_s``."""
        try:
            b0 = self._beats()
            time.sleep(window_s)
            b1 = self._beats()
            states = self.states()
        except Exception as e:
            return f"the rendezvous store is unreachable ({type(e).__name__}: {e})"
        failed = [f"rank {r} {st}" for r, st in states.items() if r != self.rank and st.startswith("failed")]
        dead = [r for r in range(self.world) if r != self.rank and b0[r] == b1[r] and not self._final(states[r])]
        parts = failed + [f"rank {r} died (no heartbeat; last state: {states[r]!r})" for r in dead]
        return "; ".join(parts) or "no rank is missing: the launcher stopped the job"

    # -- collectives
    def _wait(self, work, what: str) -> None:
        start = time.monotonic()
        last_check = start
        while not work.is_completed():
            now = time.monotonic()
            if now - start > self.timeout_s:
                seqs, states = self._seqs(), self.states()
                late = [r for r, n in seqs.items() if n < self.seq]
                names = ", ".join(f"rank {r} (last state: {states[r]!r})" for r in late) or "none (all arrived)"
                raise PeerFailure(f"{what} did not complete within {self.timeout_s:g} s; "
                                  f"ranks that never reached it: {names}")
            if now - last_check > 0.5:
                last_check = now
                self._check_peers()
            time.sleep(0.005 if now - start < 0.2 else 0.05)
        try:
            work.wait()
        except Exception as e:  # a peer's socket closed: find out which peer
            raise PeerFailure(f"{what} failed ({type(e).__name__}); {self.diagnose()}") from e
        self.state(f"past {what}")

    def _enter(self, what: str) -> None:
        self.seq += 1
        self.store.set(f"cpsim/seq/{self.rank}", str(self.seq))
        self.state(f"in {what}")

    def all_gather(self, t: torch.Tensor, group=None, group_size: int | None = None, what: str = "all-gather",
                   ctrl: bool = False) -> torch.Tensor:
        """[group_size * len(t)] on the host: ``t`` of every rank in group order."""
        import torch.distributed as dist
        self._enter(what)
        n = group_size or self.world
        on = torch.device("cpu") if ctrl else self.dev.comm_device
        src = t.contiguous().to(on)
        out = torch.empty(n * src.numel(), dtype=src.dtype, device=on)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        work = gather(out, src.flatten(), group=self.ctrl if ctrl else group, async_op=True)
        self._wait(work, what)
        return out.cpu()

    def all_gather_bytes(self, data: bytes, what: str = "exchange") -> list[bytes]:
        """Every rank's bytes, on every rank (through the host gloo group)."""
        sizes = self.all_gather(torch.tensor([len(data)], dtype=torch.int64), what=f"{what} (sizes)", ctrl=True)
        width = max(int(sizes.max()), 1)
        buf = torch.zeros(width, dtype=torch.uint8)
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else buf[:0]
        out = self.all_gather(buf, what=what, ctrl=True).view(self.world, width)
        return [bytes(out[r, : int(sizes[r])].tolist()) for r in range(self.world)]

    def all_gather_objects(self, obj, what: str = "exchange") -> list:
        return [pickle.loads(b) for b in self.all_gather_bytes(pickle.dumps(obj), what)]

    def cp_group(self, size: int) -> tuple[int, object | None]:
        """(replica index, process group) of this rank for CP groups of ``size`` consecutive ranks.

        Every rank creates every group, in the same order (``new_group`` is collective).
        Ranks past the last full group get (-1, None).
        """
        import torch.distributed as dist
        if size not in self._groups:
            mine: tuple[int, object | None] = (-1, None)
            for g in range(self.world // size):
                ranks = list(range(g * size, (g + 1) * size))
                pg = dist.new_group(ranks, timeout=timedelta(seconds=self.timeout_s)) if size > 1 else None
                if self.rank in ranks:
                    mine = (g, pg)
            self._groups[size] = mine
        return self._groups[size]

    # -- stopping
    def fail(self, exc: BaseException) -> int:
        """Report this rank's failure to the others, print it, and end the process (never returns)."""
        err = sys.stderr
        if isinstance(exc, Terminated) or _TERMINATED.is_set():
            self._safe_state("terminated")
            msg = f"[rank {self.rank}] terminated by the launcher: {self.diagnose()}"
        elif isinstance(exc, PeerFailure):
            self._safe_state(f"aborted: {exc}")
            msg = f"[rank {self.rank}] stopping: {exc}"
        elif isinstance(exc, (ConfigError, DistError)):  # a usage problem: the message says it all
            self._safe_state(f"failed: {exc}")
            _record(exc)
            self._linger()
            msg = f"[rank {self.rank}] failed: {exc}"
        else:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            print(f"[rank {self.rank}] raised on {socket.gethostname()} (pid {os.getpid()}):\n{text}",
                  file=err, end="", flush=True)
            self._safe_state(f"failed: {type(exc).__name__}: {exc}")
            _record(exc)
            self._linger()
            msg = f"[rank {self.rank}] failed: {type(exc).__name__}: {exc}"
        print(msg, file=err, flush=True)
        sys.stdout.flush()
        # A process group with a collective in flight can block in its destructor: leave now.
        os._exit(1)

    def _safe_state(self, text: str) -> None:
        try:
            self.state(text)
        except Exception as e:  # the store is gone: nothing left to tell the peers
            print(f"[rank {self.rank}] could not report {text!r}: {e}", file=sys.stderr)

    def _linger(self, limit_s: float = 10.0) -> None:
        """Give the peers time to read this rank's failure before the launcher kills them."""
        end = time.monotonic() + min(limit_s, self.timeout_s)
        try:
            while time.monotonic() < end:
                if all(self._final(st) for r, st in self.states().items() if r != self.rank):
                    return
                time.sleep(0.2)
        except Exception:  # the store is gone, so are the peers
            return


def _record(exc: BaseException) -> None:
    """Write torchrun's error file so its failure summary carries this traceback."""
    if "TORCHELASTIC_ERROR_FILE" not in os.environ:
        return
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler
    get_error_handler().record_exception(exc)

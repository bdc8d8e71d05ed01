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
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import torch

from cpsim.errors import ConfigError, DistError
from cpsim.run import plain
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


def end_on_bad_input(message: str, timeout_s: float | None, code: int = 2) -> int:
    """Under torchrun, end every rank on the same bad input together, printing it once.

    Never returns under torchrun's agent; returns ``code`` elsewhere (RANK / WORLD_SIZE set by
    another launcher or a test), leaving the printing to the caller.

    Bad input is found before any process group exists, on every rank alike (they parse the same
    command line). Left alone, the first rank to exit makes torchrun SIGTERM the others, maybe
    before rank 0 has printed anything, and they end with -15 instead of 2. Instead each rank
    counts itself in through the agent's store and waits (bounded) for the others; rank 0
    prints the message, another rank only a message that differs from rank 0's.
    """
    try:
        env = Env.from_environ()
    except ConfigError:  # RANK / WORLD_SIZE are not torchrun's
        return code
    bound = timeout_s if timeout_s is not None and 0 < timeout_s < math.inf else EARLY_BOUND_S
    store = _agent_store(bound)
    if store is None:  # not under torchrun's agent: the caller prints and returns as usual
        return code
    signal.signal(signal.SIGTERM, lambda *_: _leave(code))  # a peer already left with the same code
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
    _leave(code)


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


_TERMINATED = threading.Event()
_AGREED: list[int] = []  # the exit code every rank agreed on; set once the job's outputs are written


def _on_sigterm(signum, frame):
    if _AGREED:  # past the last barrier: the launcher stops us because a peer left first with the same code
        _leave(_AGREED[0])
    # Raised wherever the main thread is (an import may wrap it); Comm.fail checks the flag.
    _TERMINATED.set()
    raise Terminated()


def _leave(code: int):
    """End the process now with ``code``: a process group with a collective in flight can block in
    its destructor, and a peer that left first makes the launcher signal the rest."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:  # a closed pipe: nothing more to say
            pass
    isolation = sys.modules.get("cpsim.run.isolation")
    if isolation is not None:  # os._exit skips atexit: end the kernel workers and what they left here
        isolation.end_workers()
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
        check_timeout(timeout_s)
        if dev.backend == "hccl":
            os.environ.update(hccl_env(timeout_s))
        c = Comm(env, dev, timeout_s)
        try:
            dist.init_process_group(dev.backend, timeout=timedelta(seconds=timeout_s))
        except Exception as e:  # a missing rank surfaces here as a store timeout
            raise DistError(f"rank {env.rank}: init_process_group({dev.backend}) did not complete within "
                            f"{timeout_s:g} s: {e}") from e
        c.store = dist.distributed_c10d._get_default_store()
        c.state("started")
        c.store.add(f"cpsim/hb/{c.rank}", 1)
        threading.Thread(target=c._beat, name="cpsim-heartbeat", daemon=True).start()
        signal.signal(signal.SIGTERM, _on_sigterm)
        # Object traffic and fingerprints always go through gloo on the host.
        c.ctrl = None if dev.backend == "gloo" else c._new_group(None, "the host (gloo) group", backend="gloo")
        c.warm_up(None, c.world, "the default process group")
        if c.ctrl is not None:
            c.warm_up(c.ctrl, c.world, "the host (gloo) group", ctrl=True)
        return c

    def _new_group(self, ranks: list[int] | None, what: str, **kw):
        """``dist.new_group`` bounded by --timeout, a failure naming the missing peers."""
        import torch.distributed as dist
        self._enter(f"creating {what}")
        try:
            pg = dist.new_group(ranks, timeout=timedelta(seconds=self.timeout_s), **kw)
        except Exception as e:
            text, ranks = self.diagnosis()
            raise PeerFailure(f"creating {what} failed ({type(e).__name__}); {text}", ranks) from e
        self.state(f"past creating {what}")
        return pg

    def warm_up(self, group, size: int, what: str, ctrl: bool = False) -> None:
        """One small bounded collective right after a group is created.

        HCCL and NCCL build their communicators lazily inside the first collective; doing it
        here, polled like every collective, turns a missing or dead peer into a named peer
        failure within --timeout instead of a raw communicator error (or a 120 s HCCL wait)
        in the middle of the first real exchange.
        """
        self.all_gather(torch.tensor([self.rank], dtype=torch.int64), group, size, f"warm-up of {what}", ctrl=ctrl)

    def _beat(self) -> None:
        key = f"cpsim/hb/{self.rank}"
        try:
            while not self._stop.wait(HEARTBEAT_S):
                self.store.add(key, 1)
        except Exception as e:  # the store went away: the peers will see this rank as silent
            self._beat_error = e

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
        """Raise PeerFailure if a peer reported a failure, was terminated, or its heartbeat went silent."""
        states = self.states()
        now = time.monotonic()
        for r, st in states.items():
            if r != self.rank and st.split(":")[0] == "failed":
                raise PeerFailure(f"rank {r} {st}", [r])
        if any(r != self.rank and st.split(":")[0] in ("aborted", "terminated") for r, st in states.items()):
            # A peer stopped or was stopped: name what is behind it (a failed or dead rank) if anything.
            raise PeerFailure(*self.diagnosis())
        for r, n in self._beats().items():
            last = self._seen.get(r)
            if last is None or last[0] != n:
                self._seen[r] = (n, now)
            elif r != self.rank and now - last[1] > self.stale_s and not self._final(states[r]):
                raise PeerFailure(f"rank {r} is gone: no heartbeat for {now - last[1]:.0f} s "
                                  f"(last state: {states[r]!r})", [r])

    def _alive(self, r: int) -> bool:
        """Whether rank ``r``'s heartbeat moved within the staleness window (as last polled)."""
        last = self._seen.get(r)
        return last is not None and time.monotonic() - last[1] <= self.stale_s

    def _causes(self, window_s: float = 3.0) -> dict[str, list]:
        """What the peers are doing, watched for ``window_s``: failed, died, terminated, aborted (each a list
        of (rank, text)), alive (ranks)."""
        b0 = self._beats()
        time.sleep(window_s)
        b1 = self._beats()
        states = self.states()
        others = [r for r in range(self.world) if r != self.rank]

        def named(prefix):
            return [(r, f"rank {r} {states[r]}") for r in others if states[r].startswith(prefix)]
        return {
            "failed": named("failed"),
            "dead": [(r, f"rank {r} died (no heartbeat; last state: {states[r]!r})") for r in others
                     if b0[r] == b1[r] and not self._final(states[r])],
            "killed": named("terminated"),
            "aborted": named("aborted"),
            "alive": [r for r in others if b0[r] != b1[r]],
        }

    @staticmethod
    def _explain(c: dict[str, list]) -> tuple[str, list[int]]:
        """(text, ranks) of the causes: failed and dead ranks first, else terminated and aborted ones."""
        named = c["failed"] + c["dead"] or c["killed"] + c["aborted"]
        if not named:
            return "no other rank failed: the job was stopped from outside", []
        return "; ".join(text for _, text in named), [r for r, _ in named]

    def diagnosis(self, window_s: float = 3.0) -> tuple[str, list[int]]:
        """(text, ranks) naming the ranks behind a stop: failed, died (silent for ``window_s``), terminated,
        in that order."""
        try:
            return self._explain(self._causes(window_s))
        except Exception as e:
            return f"the rendezvous store is unreachable ({type(e).__name__}: {e})", []

    def diagnose(self, window_s: float = 3.0) -> str:
        return self.diagnosis(window_s)[0]

    # -- collectives
    def _wait(self, work, what: str) -> None:
        start = time.monotonic()
        last_check = start
        while not work.is_completed():
            now = time.monotonic()
            if now - start > self.timeout_s:
                self._check_peers()  # a peer that failed or died is the better name
                raise PeerFailure(*self._late(what))
            if now - last_check > 0.5:
                last_check = now
                self._check_peers()
            time.sleep(0.005 if now - start < 0.2 else 0.05)
        try:
            work.wait()
        except Exception as e:  # a peer's socket closed, or the backend's own timeout: find out which peer
            raise PeerFailure(*self._why_failed(what, e)) from e
        self.state(f"past {what}")

    def _why_failed(self, what: str, e: Exception) -> tuple[str, list[int]]:
        """A collective ended in an error: a failed or dead peer first, else the ranks that never reached it."""
        try:
            c = self._causes()
            if not (c["failed"] or c["dead"]) and any(n < self.seq for n in self._seqs().values()):
                return self._late(what, alive=set(c["alive"]))
            text, ranks = self._explain(c)
            return f"{what} failed ({type(e).__name__}); {text}", ranks
        except Exception as e2:
            return f"{what} failed ({type(e).__name__}); the rendezvous store is unreachable ({e2})", []

    def _late(self, what: str, alive: set[int] | None = None) -> tuple[str, list[int]]:
        """(text, ranks) naming the ranks that never reached ``what``: slow (heartbeat alive) or silent."""
        seqs, states = self._seqs(), self.states()
        late = [r for r, n in seqs.items() if n < self.seq]
        if not late:
            return f"{what} did not complete within {self.timeout_s:g} s although every rank reached it", []
        parts = []
        for r in late:
            up = self._alive(r) if alive is None else r in alive
            how = "its heartbeat is alive" if up else "its heartbeat is silent"
            parts.append(f"rank {r} did not reach {what} within {self.timeout_s:g} s; {how} "
                         f"(last state: {states[r]!r})")
        return "; ".join(parts), late

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

    def all_gather_objects(self, obj, what: str = "exchange", classes: tuple = ()) -> list:
        """Every rank's ``obj`` as plain data (``cpsim.run.plain``: JSON, never pickle); ``classes``: the
        dataclasses it may hold. A payload that is not is a DistError naming the rank."""
        out = []
        for r, data in enumerate(self.all_gather_bytes(plain.encode(obj), what)):
            try:
                out.append(plain.decode(data, classes))
            except plain.PlainError as e:
                raise DistError(f"{what}: rank {r} sent what is not plain data ({e})") from None
        return out

    def cp_group(self, size: int) -> tuple[int, object | None]:
        """(replica index, process group) of this rank for CP groups of ``size`` consecutive ranks.

        Every rank creates every group, in the same order (``new_group`` is collective).
        Ranks past the last full group get (-1, None). A new group is warmed up at once (see ``warm_up``).
        """
        if size not in self._groups:
            mine: tuple[int, object | None] = (-1, None)
            for g in range(self.world // size):
                ranks = list(range(g * size, (g + 1) * size))
                pg = self._new_group(ranks, f"CP group {g} of size {size}") if size > 1 else None
                if self.rank in ranks:
                    mine = (g, pg)
            if mine[1] is not None:
                if os.environ.get("CPSIM_TEST_WARMUP_EXIT_RANK", "").strip() == str(self.rank):
                    print(f"[rank {self.rank}] test hook CPSIM_TEST_WARMUP_EXIT_RANK: exiting before the warm-up",
                          file=sys.stderr, flush=True)
                    os._exit(3)
                self.warm_up(mine[1], size, f"CP group {mine[0]} of size {size}")
            elif size > 1:  # idle rank: count the warm-up the others do, so the seq numbers stay in step
                self.seq += 1
                self.store.set(f"cpsim/seq/{self.rank}", str(self.seq))
            self._groups[size] = mine
        return self._groups[size]

    # -- stopping
    def fail(self, exc: BaseException, on_stop: Callable[[str, list[int]], None] | None = None) -> int:
        """Report this rank's failure to the others, print it, and end the process (never returns).

        A rank that failed or was terminated lingers (bounded) until the peers have read it, so they
        name it from its state instead of from torchrun's SIGTERM; either way the state stays in the
        agent's store, which outlives the workers.

        On rank 0, ``on_stop(message, ranks)`` then writes the report of the stop (the ranks named as
        its cause) before the linger: torchrun SIGTERMs rank 0 as soon as a peer is gone and SIGKILLs it
        30 s later, and this path (a 3 s look at the heartbeats, the files, at most 10 s of linger)
        ends within that grace.
        """
        err = sys.stderr
        # This rank is ending already (bounded): a later SIGTERM, e.g. the launcher's once a peer
        # left, must not cut short the message, the report of the stop or the linger.
        signal.signal(signal.SIGTERM, lambda *_: None)
        if isinstance(exc, Terminated) or _TERMINATED.is_set():
            self._safe_state(f"terminated: SIGTERM while {self._own_state()!r}")
            text, ranks = self.diagnosis()
            msg = f"[rank {self.rank}] terminated by SIGTERM: {text}"
        elif isinstance(exc, PeerFailure):
            self._safe_state(f"aborted: {exc}")
            msg, ranks = f"[rank {self.rank}] stopping: {exc}", exc.ranks
        elif isinstance(exc, (ConfigError, DistError)):  # a usage problem: the message says it all
            self._safe_state(f"failed: {exc}")
            msg, ranks = f"[rank {self.rank}] failed: {exc}", [self.rank]
        else:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            print(f"[rank {self.rank}] raised on {socket.gethostname()} (pid {os.getpid()}):\n{text}",
                  file=err, end="", flush=True)
            self._safe_state(f"failed: {type(exc).__name__}: {exc}")
            msg, ranks = f"[rank {self.rank}] failed: {type(exc).__name__}: {exc}", [self.rank]
        print(msg, file=err, flush=True)
        _record(DistError(msg))
        if on_stop is not None and self.rank == 0 and not isinstance(exc, ConfigError):
            try:
                on_stop(msg, ranks)
            except Exception as e:  # noqa: BLE001  (an unwritable file: said in one line, the exit stays 1)
                print(f"[rank {self.rank}] could not write the report of the stop: {type(e).__name__}: {e}",
                      file=err, flush=True)
        if not isinstance(exc, PeerFailure):  # a stopping peer's reason stays in the store for the rest
            self._linger()
        # Bad input found inside the run (a user kernel breaking its ABI) is still bad input: 2, which
        # the launcher reports when every rank ended so (it is found on every rank alike).
        _leave(2 if isinstance(exc, ConfigError) else 1)

    def _own_state(self) -> str:
        try:
            return self.states()[self.rank]
        except Exception:  # the store is gone
            return "unknown"

    def finish(self, code: int) -> int:
        """Agree on the exit code after rank 0 has written every output, then leave together (never returns).

        The collective is the job's last barrier: no rank can exit before rank 0 has reached it,
        that is before the report and every --json/--junit/--html file are written. A rank that
        leaves first makes torchrun SIGTERM the others; past this point that signal just ends
        them with the agreed code.
        """
        agreed = int(self.all_gather(torch.tensor([code]), what="exit code", ctrl=True).max())
        _AGREED.append(agreed)
        self._safe_state("done")
        self._stop.set()
        _leave(agreed)

    def _safe_state(self, text: str) -> None:
        try:
            self.state(text)
        except Exception as e:  # the store is gone: nothing left to tell the peers
            print(f"[rank {self.rank}] could not report {text!r}: {e}", file=sys.stderr)

    def _linger(self, limit_s: float = 10.0, silent_s: float = 2.0) -> None:
        """Give the peers time to read this rank's ending before it exits (the launcher then stops them).

        Waits until every peer has ended (a final state) or is gone (heartbeat silent for ``silent_s``).
        """
        end = time.monotonic() + min(limit_s, self.timeout_s)
        seen: dict[int, tuple[int, float]] = {}
        try:
            while time.monotonic() < end:
                now, states, beats = time.monotonic(), self.states(), self._beats()
                waiting = False
                for r in range(self.world):
                    if r == self.rank or self._final(states[r]):
                        continue
                    if r not in seen or seen[r][0] != beats[r]:
                        seen[r] = (beats[r], now)
                    if now - seen[r][1] < silent_s:
                        waiting = True
                if not waiting:
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

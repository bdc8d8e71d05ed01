"""The initialised torchrun world (``Comm``): bounded collectives plus the liveness protocol
through the rendezvous store (``cpsim.run.dist``'s docstring lists its keys).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Callable

import torch

from cpsim.errors import ConfigError, DistError
from cpsim.run import plain
from cpsim.run.dist import (FINAL, HEARTBEAT_S, DeviceChoice, Env, PeerFailure, Terminated, _leave, check_timeout,
                            hccl_env)


# ---- the communicator --------------------------------------------------------------

class Comm:
    """The initialised world: bounded collectives plus the liveness protocol."""

    def __init__(self, env: Env, dev: DeviceChoice, timeout_s: float, on_leave: Callable[[], None] | None = None):
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
        self.terminated = threading.Event()  # SIGTERM came (``_on_sigterm``)
        self.agreed: int | None = None  # the exit code every rank agreed on; set once the job's outputs are written
        self.on_leave = on_leave  # what ends before the process leaves (its kernel runner's workers)

    # -- setup / teardown
    @staticmethod
    def init(env: Env, dev: DeviceChoice, timeout_s: float, on_leave: Callable[[], None] | None = None) -> "Comm":
        import torch.distributed as dist
        check_timeout(timeout_s)
        if dev.backend == "hccl":
            os.environ.update(hccl_env(timeout_s))
        c = Comm(env, dev, timeout_s, on_leave)
        try:
            dist.init_process_group(dev.backend, timeout=timedelta(seconds=timeout_s))
        except Exception as e:  # a missing rank surfaces here as a store timeout
            raise DistError(f"rank {env.rank}: init_process_group({dev.backend}) did not complete within "
                            f"{timeout_s:g} s: {e}") from e
        c.store = dist.distributed_c10d._get_default_store()
        c.state("started")
        c.store.add(f"cpsim/hb/{c.rank}", 1)
        threading.Thread(target=c._beat, name="cpsim-heartbeat", daemon=True).start()
        signal.signal(signal.SIGTERM, c._on_sigterm)
        # Object traffic and fingerprints always go through gloo on the host.
        c.ctrl = None if dev.backend == "gloo" else c._new_group(None, "the host (gloo) group", backend="gloo")
        c.warm_up(None, c.world, "the default process group")
        if c.ctrl is not None:
            c.warm_up(c.ctrl, c.world, "the host (gloo) group", ctrl=True)
        return c

    def _on_sigterm(self, signum, frame):
        if self.agreed is not None:  # past the last barrier: the launcher stops us because a peer left first
            _leave(self.agreed, self.on_leave)
        # Raised wherever the main thread is (an import may wrap it); ``fail`` checks the flag.
        self.terminated.set()
        raise Terminated()

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
        if isinstance(exc, Terminated) or self.terminated.is_set():
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
        _leave(2 if isinstance(exc, ConfigError) else 1, self.on_leave)

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
        self.agreed = agreed
        self._safe_state("done")
        self._stop.set()
        _leave(agreed, self.on_leave)

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

"""Kernels run in a child process, bounded in time, so that nothing they do can end the run well.

The kernel under test is hostile input: it may raise, crash the interpreter
(an out-of-bounds store under the Triton interpreter is a SIGSEGV), never return,
or call ``sys.exit(0)`` / ``os._exit(0)``. In cpsim's own process any of these
would lose the report, hang the run or - worst - end it with exit code 0. So
every rank run of a path (``cpsim.paths.run_path``) goes to a persistent worker
process and comes back as a ``RankOutput`` or as a ``KernelFailure`` the
coordinator reports (invariant ``kernel-completes``, exit 1).

Why a persistent forkserver worker: ``fork`` from a process that has started
torch's thread pools may deadlock in the child, and a fresh ``spawn`` per rank
run costs a torch import each time (seconds on a busy CPU). The forkserver starts
clean, preloads torch and cpsim once, and forks the worker from that warm state;
the worker stays up for the whole command (fuzz reuses it across scenarios) and
is only replaced after a crash or a timeout. Triton is imported inside the worker
after ``TRITON_INTERPRET=1`` is set (``cpsim.paths._inputs.prepare_triton``).
Cost: docs/BENCHMARKS.md.

Under torchrun (``run_rank_checked``) only the user's kernels go to a worker: the
rank is already a process of its own with bounded collectives.

``CPSIM_KERNEL_ISOLATION=0`` runs kernels in-process (exceptions and ``sys.exit``
still become failures; crashes and hangs are not caught) - for debugging only.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from dataclasses import dataclass, replace

import torch

from cpsim.errors import ConfigError, DistError
from cpsim.paths import KernelFailure, Knobs, RankOutput, run_path

DEFAULT_TIMEOUT_S = 300.0
STARTUP_S = 120.0  # bound for starting the worker and importing Triton there (not the kernel's time)


@dataclass(frozen=True)
class Isolation:
    process: bool = True                # run kernels in the worker process
    timeout_s: float = DEFAULT_TIMEOUT_S  # wall-clock bound of one rank run of one path


_config = Isolation(process=os.environ.get("CPSIM_KERNEL_ISOLATION", "1") != "0")


def configure(timeout_s: float | None = None, process: bool | None = None) -> Isolation:
    global _config
    if timeout_s is not None:
        if not timeout_s > 0 or timeout_s == float("inf"):
            raise ConfigError("--kernel-timeout", f"must be a finite number of seconds > 0, got {timeout_s:g}")
        _config = replace(_config, timeout_s=float(timeout_s))
    if process is not None:
        _config = replace(_config, process=process)
    return _config


def configure_from_args(args) -> Isolation:
    """``--kernel-timeout``, else ``--timeout``, else the default bound."""
    t = getattr(args, "kernel_timeout", None)
    if t is None:
        t = getattr(args, "timeout", None)
    return configure(t)


def current() -> Isolation:
    return _config


class KernelFailed(DistError):
    """A rank run that did not complete; ``failure`` says how.

    The virtual world turns it into a ``kernel-completes`` violation; under torchrun
    it ends the rank like any DistError: one line naming the kernel and the rank.
    """

    def __init__(self, failure: KernelFailure):
        self.failure = failure
        super().__init__(failure.message)


def _label(path: str, kernel) -> str:
    return f"{path}: {kernel.spec}" if kernel is not None else f"{path}: built-in kernel"


def _fail(kind: str, text: str, path: str, rank: int, kernel, group: str = "*") -> KernelFailed:
    where = f"on rank {rank}" + (f", group {group}" if group != "*" else "")
    return KernelFailed(KernelFailure(path, rank, kind, f"kernel {text} {where} [{_label(path, kernel)}]", group))


def _exit_text(code: int | None) -> tuple[str, str]:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return "crashed", f"crashed with {name}"
    return "exited", f"ended its process with exit code {code} (os._exit or a fatal error)"


class Worker:
    """One child process running rank runs; restarted after it dies or is killed."""

    def __init__(self) -> None:
        self.proc = None
        self.conn = None
        self.device: str | None = None
        self.in_process: set[int] = set()  # id() of kernels the worker could not reload

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def start(self, device: str) -> None:
        from cpsim.run import kernel_worker
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["cpsim.run.kernel_worker"])
        here, there = ctx.Pipe()
        self.proc = ctx.Process(target=kernel_worker.serve, args=(there, os.getpid()), daemon=True, name="cpsim-kernel-worker")
        self.proc.start()
        there.close()
        self.conn, self.device = here, device
        reply = self._ask(("prepare", device), STARTUP_S)
        if reply[0] != "ok":
            self.stop()
            if reply is not None and reply[0] == "config":
                raise ConfigError(reply[1], reply[2])
            raise ConfigError("kernel worker", f"the kernel worker process did not start within {STARTUP_S:g} s "
                                               f"({reply!r}); set CPSIM_KERNEL_ISOLATION=0 to run kernels in-process")

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    def _ask(self, msg, timeout: float):
        """The reply; ("timeout",) when the child did not answer in time, ("dead",) when it died."""
        try:
            self.conn.send(msg)
            if not self.conn.poll(timeout):
                return ("timeout",)
            return self.conn.recv()
        except (EOFError, OSError):
            return ("dead",)

    def run(self, path: str, s, allocs, rank: int, device: str, knobs: Knobs, kernel, timeout: float
            ) -> RankOutput | None:
        from cpsim.run.kernel_worker import unpack
        if kernel is not None and id(kernel) in self.in_process:
            return _in_process(path, s, allocs, rank, device, knobs, kernel)
        if not self.alive() or self.device != device:
            self.stop()
            self.start(device)
        record = None if kernel is None else kernel.record()
        reply = self._ask(("run", path, s, allocs, rank, device, knobs, record), timeout)
        if reply[0] == "timeout":
            self.stop()
            raise _fail("timeout", f"exceeded {timeout:g} s (worker killed)", path, rank, kernel)
        if reply[0] == "dead":
            self.proc.join(5)
            code = self.proc.exitcode
            self.stop()
            kind, text = _exit_text(code)
            raise _fail(kind, text, path, rank, kernel)
        what = reply[0]
        if what == "ok":
            for note in reply[2]:
                kernel.note(note)
            out = unpack(reply[1])
            return out
        if what == "config":
            raise ConfigError(reply[1], reply[2])
        if what == "raised":
            raise _fail("raised", f"raised {reply[1]}" + (f": {reply[2]}" if reply[2] else ""), path, rank,
                        kernel, reply[3])
        if what == "exit":
            raise _fail("exited", f"called sys.exit({reply[1]})", path, rank, kernel, reply[2])
        if what == "unloadable":
            self.in_process.add(id(kernel))
            kernel.note(f"the kernel worker could not reload it ({reply[1]}); it runs in cpsim's own process, "
                        f"where a crash or a hang is not caught")
            return _in_process(path, s, allocs, rank, device, knobs, kernel)
        raise AssertionError(f"unknown worker reply {what!r}")


def _in_process(path: str, s, allocs, rank: int, device: str, knobs: Knobs, kernel) -> RankOutput | None:
    """The unprotected fallback: exceptions and sys.exit still become failures."""
    from cpsim.paths import _guard
    try:
        return run_path(path, s, allocs, rank, device, knobs, kernel)
    except ConfigError:
        raise
    except SystemExit as e:
        raise _fail("exited", f"called sys.exit({e.code!r})", path, rank, kernel, _guard.launching()) from None
    except Exception as e:  # noqa: BLE001  (the kernel's exception becomes a named violation)
        text = str(e).splitlines()[0] if str(e) else ""
        raise _fail("raised", f"raised {type(e).__name__}" + (f": {text}" if text else ""), path, rank, kernel,
                    _guard.launching()) from None


_worker = Worker()


def run_rank(path: str, s, allocs, rank: int, device, knobs: Knobs = Knobs(), kernel=None,
             builtin_in_worker: bool = True) -> RankOutput | None:
    """``run_path`` for one rank under the configured isolation; raises ``KernelFailed``."""
    device = str(device)
    from cpsim import capture
    # A capture records the launches of this process: the worker's would go unrecorded.
    if not _config.process or (kernel is None and not builtin_in_worker) or capture.active() is not None:
        return _in_process(path, s, allocs, rank, device, knobs, kernel)
    return _worker.run(path, s, allocs, rank, device, knobs, kernel, _config.timeout_s)


def run_rank_checked(path: str, s, allocs, rank: int, device, knobs: Knobs = Knobs(), kernel=None
                     ) -> RankOutput | None:
    """For a torchrun rank, which gathers slots but not guards: a broken guard is a failure here.

    Only the user's kernels go to the worker here: every torchrun rank is already its own
    process with bounded collectives, and a second process per rank for cpsim's own
    kernels would double the processes on an oversubscribed host for no protection.
    """
    from cpsim.layout import GUARD
    out = run_rank(path, s, allocs, rank, device, knobs, kernel, builtin_in_worker=False)
    if out is None:
        return None
    if out.guard is not None and bool((out.guard != GUARD).any()):
        bad = [s.groups[gi].name for gi in (out.guard != GUARD).any(1).nonzero().flatten().tolist()]
        raise KernelFailed(KernelFailure(path, rank, "guard", f"kernel wrote outside its slot buffer on rank {rank}, "
                                                              f"group {','.join(bad)} [{_label(path, kernel)}]",
                                         ",".join(bad)))
    out.slots = out.slots.to(torch.device(device))
    return out

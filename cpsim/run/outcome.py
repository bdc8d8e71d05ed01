"""How a rank run that did not complete is named: the ``KernelFailed`` both worlds raise, and its text.

A kernel's exception becomes a reply (``kernel_error``) and a reply a failure (``failed``) by one
mapping, whether the kernel ran in a worker (``cpsim.run.kernel_worker`` sends the reply, the
parent's ``Worker.answer`` reads it) or in this process (``cpsim.run.in_process``).
"""

from __future__ import annotations

import signal

from cpsim.errors import ConfigError, DistError
from cpsim.paths import KernelFailure
from cpsim.run import wire


class KernelFailed(DistError):
    """A rank run that did not complete; ``failure`` says how.

    Both worlds turn it into a ``kernel-completes`` violation (under torchrun the
    failure record is gathered in place of the rank's slots, ``cpsim.run.distrun``).
    """

    def __init__(self, failure: KernelFailure):
        self.failure = failure
        super().__init__(failure.message)


def _label(path: str, kernel) -> str:
    return f"{path}: {kernel.spec}" if kernel is not None else f"{path}: built-in kernel"


def _fail(kind: str, text: str, path: str, rank: int, kernel, group: str = "*") -> KernelFailed:
    where = f"on rank {rank}" + (f", group {group}" if group != "*" else "")
    return KernelFailed(KernelFailure(path, rank, kind, f"kernel {text} {where} [{_label(path, kernel)}]", group))


def raised_text(name: str, text: str) -> str:
    """"raised NAME: message at FILE:LINE ..." (no colon before the place when the message is empty)."""
    return f"raised {name}" + ("" if not text else f"{text}" if text.startswith(" at ") else f": {text}")


def _exit_text(code: int | None) -> tuple[str, str]:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return "crashed", f"crashed with {name}"
    return "exited", f"ended its process with exit code {code} (os._exit or a fatal error)"


def _unloaded(path: str, kernel, rank: int, world: int) -> KernelFailure | None:
    """The failure of every run of a kernel whose import raised, exited, hung or crashed."""
    failure = None if kernel is None else kernel.load_failure
    if failure is None:
        return None
    return KernelFailure(path, rank, failure.kind, f"kernel {failure.message} [{_label(path, kernel)}]",
                         "*", [r for r in range(world) if r != rank])


def first_line(e: BaseException) -> str:
    return str(e).splitlines()[0][:wire.MAX_TEXT // 2] if str(e) else ""


def kernel_error(e: BaseException, kernel, group: str = "*") -> wire.Refused | wire.Exited | wire.Raised:
    """The reply that names what the kernel raised: bad input (a ``ConfigError``), ``sys.exit``, or any
    other exception, with the place in the kernel's file it came from. ``group``: the launch it was in."""
    if isinstance(e, ConfigError):
        return wire.Refused(e.field, e.rule)
    if isinstance(e, SystemExit):
        return wire.Exited(repr(e.code)[:200], group)
    from cpsim.kernels.under_test import where_raised
    return wire.Raised(type(e).__name__[:200], (first_line(e) + where_raised(kernel, e))[:wire.MAX_TEXT], group)


def failed(reply: wire.Raised | wire.Exited | wire.Unloaded, path: str, rank: int, kernel) -> KernelFailed:
    """The failure on ``rank`` a kernel's ``Raised``, ``Exited`` or ``Unloaded`` reply names."""
    if isinstance(reply, wire.Raised):
        return _fail("raised", raised_text(reply.name, reply.text), path, rank, kernel, reply.group)
    if isinstance(reply, wire.Exited):
        return _fail("exited", f"called sys.exit({reply.code})", path, rank, kernel, reply.group)
    return _fail(reply.kind, reply.message, path, rank, kernel)

"""How a rank run that did not complete is named: the ``KernelFailed`` both worlds raise, and its text.

Shared by the worker handle (a child's reply or its death), the in-process fallback and the runner.
"""

from __future__ import annotations

import signal

from cpsim.errors import DistError
from cpsim.paths import KernelFailure


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

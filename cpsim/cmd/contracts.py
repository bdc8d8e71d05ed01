"""Which release contract judges each kernel under test, and the exit status that implies.

A kernel file from a release the table does not list is judged with the nearest listed release's
contract (cpsim.kernels.release_of); where that release's contract files changed, a run that found no
violation still says so and exits ``releases.UNREAD_CHANGES_EXIT`` (docs/UPSTREAM.md). ``run``,
``sweep``, ``fuzz`` and every torchrun route share these, so they report it alike.
"""

from __future__ import annotations

from cpsim import releases
from cpsim.check import coordinator
from cpsim.kernels.release_of import kernel_standing


def kernel_standings(kernels: dict) -> dict:
    """path -> the standing of its kernel's release where the file comes from a release cpsim's table does
    not list (cpsim.kernels.release_of)."""
    found = {p: kernel_standing(k.spec, p) for p, k in (kernels or {}).items()}
    return {p: st for p, st in found.items() if st is not None}


def contract_lines(held: dict) -> list[str]:
    return [f"contract ({p}): {st.line()}" for p, st in held.items()]


def print_contracts(console, held: dict, quiet: bool = False) -> None:
    """Every standing's line; with ``quiet`` only those with unread changes (they decide the exit status)."""
    for line in contract_lines({p: st for p, st in held.items() if st.unread or not quiet}):
        console.print(line, highlight=False, soft_wrap=True, markup=False)


def status(passed: bool, held: dict) -> int:
    """1 on a violation; else UNREAD_CHANGES_EXIT when a kernel's unlisted release has unread contract
    changes; else 0."""
    if not passed:
        return 1
    return releases.UNREAD_CHANGES_EXIT if any(st.unread for st in held.values()) else 0


def run_status(verdicts, held: dict) -> int:
    return status(coordinator.passed(verdicts), held)

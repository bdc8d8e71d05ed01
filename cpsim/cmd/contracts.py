"""Which release contract judges each kernel under test, and the exit status that implies.

A kernel file from a release the table does not list is judged with the nearest listed release's
contract (cpsim.kernels.release_of); where that release's contract files changed, a run that found no
violation still says so and exits ``releases.UNREAD_CHANGES_EXIT`` (docs/UPSTREAM.md).
"""

from __future__ import annotations

from cpsim.check import coordinator


def kernel_standings(kernels: dict) -> dict:
    """path -> the standing of its kernel's release where the file comes from a release cpsim's table does
    not list (cpsim.kernels.release_of)."""
    from cpsim.kernels.release_of import kernel_standing
    found = {p: kernel_standing(k.spec, p) for p, k in (kernels or {}).items()}
    return {p: st for p, st in found.items() if st is not None}


def contract_lines(held: dict) -> list[str]:
    return [f"contract ({p}): {st.line()}" for p, st in held.items()]


def run_status(verdicts, held: dict) -> int:
    """1 on a violation; UNREAD_CHANGES_EXIT when a kernel's unlisted release has unread contract changes."""
    from cpsim import releases
    if not coordinator.passed(verdicts):
        return 1
    return releases.UNREAD_CHANGES_EXIT if any(st.unread for st in held.values()) else 0

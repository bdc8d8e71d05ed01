"""What judges a command's kernels under test, the lines every report describes them with, and the exit
status that implies.

A kernel file from a release the table does not list is judged with the nearest listed release's
contract (cpsim.kernels.release_of); where that release's contract files changed, a run that found no
violation still says so and exits ``releases.UNREAD_CHANGES_EXIT`` (docs/UPSTREAM.md). ``run``,
``sweep``, ``fuzz`` and every torchrun route share these, so they report it alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cpsim import releases
from cpsim.check import coordinator, profiles
from cpsim.kernels.release_of import kernel_standing
from cpsim.kernels.subject import distinct_notes, subjects


@dataclass(frozen=True)
class Judged:
    """The kernels under test and what judges them, for every report of a run: the release profile and its
    notes on the scenario, and the standings of kernels from releases cpsim's table does not list (worked
    out once); what ran on each path and the adapters' notes (read when asked: an adapter notes what it
    could not model while its kernel runs)."""
    kernels: dict
    paths: list[str]
    profile: Any
    held: dict
    profile_notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, kernels: dict, paths, profile, s=None) -> "Judged":
        """``s``: the scenario as the profile lays it out, for the profile's notes (none: no notes)."""
        return cls(kernels, list(paths), profile, kernel_standings(kernels),
                   profiles.notes(s, profile, paths) if s is not None else [])

    def subjects(self) -> dict:
        """What ran on each path, as plain data for every report (``cpsim.kernels.subject``)."""
        return subjects_for(self.kernels, self.paths, self.profile.name)

    def describe(self, console, notes_only: bool = True, profile: bool = True) -> None:
        """The kernels' lines (``notes_only``: the report's heading named them already) and adapter notes, then
        (``profile``) the profile and what it leaves unjudged or lays out anew."""
        describe_kernels(console, self.kernels, notes_only)
        if profile:
            show_profile(console, self.profile, notes=self.profile_notes)

    def describe_contracts(self, console, quiet: bool = False) -> None:
        print_contracts(console, self.held, quiet)

    def contracts(self) -> dict:
        """The --json's ``contracts``: path -> its kernel's release standing."""
        return {p: st.to_dict() for p, st in self.held.items()}

    def status(self, verdicts) -> int:
        return status(coordinator.passed(verdicts), self.held)


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


def subjects_for(kernels: dict, paths, profile: str | None = None) -> dict:
    """What ran on each of ``paths``, as plain data for every report (``cpsim.kernels.subject``), with the
    release profile the oracle judged by (default: the one the kernels imply)."""
    name = profile or profiles.for_abis([k.abi for k in (kernels or {}).values()]).name
    return subjects(kernels or {}, list(dict.fromkeys([*paths, *(kernels or {})])), name)


def show_profile(console, prof, s=None, paths=(), notes: list[str] | None = None) -> None:
    """``profile: NAME (releases)``, then what the profile leaves unjudged or lays out anew in ``s`` (``notes``:
    those lines, worked out already)."""
    console.print(f"profile: {prof.name} ({prof.releases})", highlight=False, soft_wrap=True)
    if notes is None:
        notes = profiles.notes(s, prof, paths) if s is not None else []
    for line in notes:
        console.print(f"  [yellow]note (profile):[/yellow] {line}", highlight=False, soft_wrap=True)


def describe_kernels(console, kernels: dict, notes_only: bool = False) -> None:
    """One line per kernel under test, then what its adapter could not model.

    ``notes_only``: the report's heading already named the kernels (``report.print_report``)."""
    for path, k in kernels.items():
        if not notes_only:
            console.print(f"kernel under test on {path}: {k.describe()}", highlight=False, soft_wrap=True)
        for note in distinct_notes(k.notes):
            console.print(f"  [yellow]note:[/yellow] {note}", highlight=False, soft_wrap=True)

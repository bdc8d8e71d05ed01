"""The report files a command on one judged scenario was asked for (--json, --junit, --html), written
the same way on every route and every ending that has verdicts: a pass, a violation, a kernel or a
stack driver that died, hung or lied."""

from __future__ import annotations

import dataclasses
from typing import Any

from cpsim.check.coordinator import Verdict
from cpsim.report import report
from cpsim.report.html import write_checked
from cpsim.report.junit import write_junit
from cpsim.report.terminal import DEFAULT_EXAMPLES
from cpsim.scenario import Scenario
from cpsim.validate import write_outputs


@dataclasses.dataclass(frozen=True)
class ReportFiles:
    """What a command was asked to report, read once from its options (``cmd.options.add_output_args``):
    the files, whether the terminal gets one line, and how many examples a failing invariant prints."""
    json: str | None = None
    junit: str | None = None
    html: str | None = None
    quiet: bool = False
    examples: int = DEFAULT_EXAMPLES

    @classmethod
    def from_args(cls, args) -> "ReportFiles":
        return cls(*(getattr(args, k, None) for k in ("json", "junit", "html")), bool(getattr(args, "quiet", False)),
                   getattr(args, "examples", DEFAULT_EXAMPLES))

    def write(self, s: Scenario, verdicts: list[Verdict], extra: dict[str, Any] | None = None,
              subjects: dict | None = None, gathered: dict | None = None,
              page_extra: dict[str, Any] | None = None, picture_note: str | None = None) -> None:
        """Each file asked for; every one that can be written is, even when another fails
        (:func:`cpsim.validate.write_outputs`). ``extra``: the JSON report's own keys; ``page_extra``: the
        page's details (``extra`` when not given); ``gathered``: the slot mappings the page draws, or
        ``picture_note`` says why there is no picture."""
        def json_() -> None:
            report.write_json(self.json, report.to_dict(s, verdicts, extra, subjects))

        def junit() -> None:
            write_junit(self.junit, [(s, verdicts)], subjects=subjects)

        def html() -> None:
            write_checked(self.html, s, gathered, verdicts, extra if page_extra is None else page_extra,
                          subjects=subjects, picture_note=picture_note)

        write_outputs([("--json", self.json, json_), ("--junit", self.junit, junit), ("--html", self.html, html)])


def write_requested(args, s: Scenario, verdicts: list[Verdict], extra: dict[str, Any] | None = None,
                    subjects: dict | None = None, gathered: dict | None = None,
                    page_extra: dict[str, Any] | None = None, picture_note: str | None = None) -> None:
    """:meth:`ReportFiles.write` for the files ``args`` asks for."""
    ReportFiles.from_args(args).write(s, verdicts, extra, subjects, gathered, page_extra, picture_note)

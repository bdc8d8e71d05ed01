"""The report files a command on one judged scenario was asked for (--json, --junit, --html), written
the same way on every route and every ending that has verdicts: a pass, a violation, a kernel or a
stack driver that died, hung or lied."""

from __future__ import annotations

from typing import Any

from cpsim.check.coordinator import Verdict
from cpsim.report import report
from cpsim.report.html import write_checked
from cpsim.report.junit import write_junit
from cpsim.scenario import Scenario
from cpsim.validate import write_outputs


def write_requested(args, s: Scenario, verdicts: list[Verdict], extra: dict[str, Any] | None = None,
                    subjects: dict | None = None, gathered: dict | None = None,
                    page_extra: dict[str, Any] | None = None, picture_note: str | None = None) -> None:
    """Each of --json / --junit / --html the command has and was given; every one that can be written
    is, even when another fails (:func:`cpsim.validate.write_outputs`). ``extra``: the JSON report's
    own keys; ``page_extra``: the page's details (``extra`` when not given); ``gathered``: the slot
    mappings the page draws, or ``picture_note`` says why there is no picture."""
    def json_() -> None:
        report.write_json(args.json, report.to_dict(s, verdicts, extra, subjects))

    def junit() -> None:
        write_junit(args.junit, [(s, verdicts)], subjects=subjects)

    def html() -> None:
        write_checked(args.html, s, gathered, verdicts, extra if page_extra is None else page_extra,
                      subjects=subjects, picture_note=picture_note)

    write_outputs([(flag, getattr(args, flag[2:], None), write)
                   for flag, write in (("--json", json_), ("--junit", junit), ("--html", html))])

"""JUnit XML for CI dashboards: one testcase per (scenario, path, invariant).

``write_junit(path, results)`` takes ``(label, verdicts)`` pairs, where a label
names one checked scenario (e.g. ``"default cp4 i16 [seed 1]"``) and verdicts
are ``coordinator.Verdict`` objects. A failed verdict becomes a ``<failure>``
whose text lists every violation; an ``n/a`` verdict becomes ``<skipped>``.
Scenarios that never ran can be listed in ``skipped`` (label -> reason).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterable, Mapping

from cpsim.coordinator import Verdict, Violation


def violation_text(v: Violation) -> str:
    ranks = f" ranks {v.ranks}" if v.ranks else ""
    lines = [f"{v.invariant} [{v.path}] group {v.group}{ranks}: {v.message}"]
    for e in v.examples:
        where = ", ".join(f"{k} {x}" for k, x in (("rank", e.rank), ("request", e.request),
                                                 ("position", e.position)) if x is not None)
        lines.append(f"    {where}: expected {e.expected}, got {e.actual}")
    return "\n".join(lines)


def to_xml(results: Iterable[tuple[str, list[Verdict]]], skipped: Mapping[str, str] | None = None,
           name: str = "cpsim") -> ET.ElementTree:
    root = ET.Element("testsuites", name=name)
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    suites = [(label, verdicts, None) for label, verdicts in results]
    suites += [(label, [], reason) for label, reason in (skipped or {}).items()]
    for label, verdicts, reason in suites:
        suite = ET.SubElement(root, "testsuite", name=label)
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        if reason is not None:
            case = ET.SubElement(suite, "testcase", classname=label, name="scenario")
            ET.SubElement(case, "skipped", message=reason)
            counts["tests"] += 1
            counts["skipped"] += 1
        for v in verdicts:
            case = ET.SubElement(suite, "testcase", classname=label, name=f"{v.path} :: {v.invariant}")
            counts["tests"] += 1
            if v.status == "fail":
                counts["failures"] += 1
                f = ET.SubElement(case, "failure", message=v.violations[0].message if v.violations else "failed",
                                  type=v.invariant)
                f.text = "\n".join(violation_text(x) for x in v.violations)
            elif v.status == "n/a":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message="not applicable")
        for k, n in counts.items():
            suite.set(k, str(n))
            totals[k] += n
        suite.set("errors", "0")
    for k, n in totals.items():
        root.set(k, str(n))
    root.set("errors", "0")
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(path: str | Path, results: Iterable[tuple[str, list[Verdict]]],
                skipped: Mapping[str, str] | None = None) -> None:
    """Write ``results`` ((label, verdicts) pairs) to ``path`` as JUnit XML."""
    to_xml(results, skipped).write(path, encoding="utf-8", xml_declaration=True)

"""JUnit XML for CI: one testcase per (scenario, path, group, invariant).

The layout is the common denominator the usual parsers (Jenkins, GitLab, GitHub
test reporters, pytest's own schema) accept: ``<testsuites>`` holding one
``<testsuite>`` per scenario with tests/failures/errors/skipped counts, each
``<testcase>`` carrying classname, name and time, a ``<failure>`` with the
violation text, or ``<skipped>`` when the invariant does not apply.

Per-group invariants get one testcase per KV-cache group; ``capacity`` is one per
path, cross-path ``paths-agree`` one per pair and group, ``same-scenario`` one per run.

``results`` items are ``(scenario, verdicts)`` or ``(scenario, verdicts, label)``; the
label names the suite when one scenario runs several times (a sweep's replicas).
Scenarios that never ran go in ``skipped`` (label -> reason), one skipped testcase each; a run
that stopped early (a torchrun job whose peer died) puts its reason in ``errors`` (label ->
message), one testcase with an ``<error>`` each.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Mapping, Sequence

from cpsim.check.coordinator import Verdict, Violation
from cpsim.scenario import KVGroup, Scenario

PER_PATH = ("capacity", "kernel-completes")
PER_RUN = ("same-scenario",)


def applies(invariant: str, g: KVGroup, s: Scenario) -> bool:
    """Whether a per-group invariant is checked for this group (SPEC §4)."""
    if invariant in ("exactly-one-owner", "no-collision", "row-bounds"):
        return g.slot_mapped
    if invariant == "owner-rule":
        return g.slot_mapped and g.world(s.cp) > 1
    if invariant == "replicas-agree":
        return g.slot_mapped and g.world(s.cp) < s.cp.world
    if invariant == "dense-local":
        return g.slot_mapped and not g.circular
    return True


def violation_text(v: Violation) -> str:
    lines = [f"{v.invariant} [{v.path}] group {v.group}"
             + (f" ranks {v.ranks}" if v.ranks else "") + f": {v.message}"]
    for e in v.examples:
        where = ", ".join(f"{k} {val}" for k, val in (("rank", e.rank), ("request", e.request),
                                                      ("position", e.position)) if val is not None)
        lines.append(f"  {where or 'entry'}: expected {e.expected}, got {e.actual}")
    return "\n".join(lines)


def _cases(s: Scenario, verdicts: list[Verdict], label: str):
    """(classname, name, status, violations, skip reason) per testcase."""
    for v in verdicts:
        cls = f"cpsim.{label}.{v.path}"
        if v.status == "not run":
            yield cls, v.invariant, "n/a", [], f"not run: {v.note}"
            continue
        if v.invariant in PER_PATH or v.invariant in PER_RUN:
            yield cls, v.invariant, v.status, v.violations, "not applicable"
            continue
        for g in s.groups:
            vios = [x for x in v.violations if x.group == g.name]
            if v.status == "n/a":
                yield cls, f"{g.name}::{v.invariant}", "n/a", [], "not applicable to this scenario or path"
            elif not applies(v.invariant, g, s):
                yield cls, f"{g.name}::{v.invariant}", "n/a", [], f"not checked for a {g.kind} group"
            else:
                yield cls, f"{g.name}::{v.invariant}", "fail" if vios else "pass", vios, ""


def subject_properties(subjects: Mapping[str, dict] | None) -> list[tuple[str, str]]:
    """``<property>`` pairs naming the kernel under test on each path (and the release profile)."""
    from cpsim.report.report import subject_line
    out = []
    for path, sub in (subjects or {}).items():
        out.append((f"cpsim.kernel.{path}", subject_line(sub)))
        for k in ("kind", "spec", "abi", "file", "sha256", "profile"):
            if sub.get(k):
                out.append((f"cpsim.kernel.{path}.{k}", str(sub[k])))
        if sub.get("replay"):
            for k in ("spec", "abi", "file", "sha256"):
                if sub["replay"].get(k):
                    out.append((f"cpsim.kernel.{path}.replay.{k}", str(sub["replay"][k])))
    return out


def _properties(suite: ET.Element, props: list[tuple[str, str]]) -> None:
    if props:
        el = ET.SubElement(suite, "properties")
        for name, value in props:
            ET.SubElement(el, "property", name=name, value=value)


def to_element(results: Sequence[tuple], skipped: Mapping[str, str] | None = None,
               subjects: Mapping[str, dict] | None = None, errors: Mapping[str, str] | None = None) -> ET.Element:
    """``subjects`` (path -> kernel under test) become each suite's ``<properties>``."""
    props = subject_properties(subjects)
    root = ET.Element("testsuites", name="cpsim")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for label, message in (errors or {}).items():
        suite = ET.SubElement(root, "testsuite", name=f"cpsim.{label}", tests="1", failures="0", errors="1",
                              skipped="0", time="0")
        case = ET.SubElement(suite, "testcase", classname=f"cpsim.{label}", name="run", time="0")
        ET.SubElement(case, "error", type="stopped", message=message[:500]).text = message
        totals["tests"] += 1
        totals["errors"] += 1
    for label, reason in (skipped or {}).items():
        suite = ET.SubElement(root, "testsuite", name=f"cpsim.{label}", tests="1", failures="0", errors="0",
                              skipped="1", time="0")
        case = ET.SubElement(suite, "testcase", classname=f"cpsim.{label}", name="scenario", time="0")
        ET.SubElement(case, "skipped", message=reason)
        totals["tests"] += 1
        totals["skipped"] += 1
    for item in results:
        s, verdicts = item[0], item[1]
        label = item[2] if len(item) > 2 else s.name
        suite = ET.SubElement(root, "testsuite", name=f"cpsim.{label}", id=s.fingerprint())
        _properties(suite, props)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for cls, name, status, vios, why in _cases(s, verdicts, label):
            case = ET.SubElement(suite, "testcase", classname=cls, name=name, time="0")
            counts["tests"] += 1
            if status == "fail":
                counts["failures"] += 1
                f = ET.SubElement(case, "failure", type=name.split("::")[-1],
                                  message=(vios[0].message if vios else "failed")[:500])
                f.text = "\n\n".join(violation_text(x) for x in vios)
            elif status == "n/a":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=why)
        for k, n in counts.items():
            suite.set(k, str(n))
            totals[k] += n
        suite.set("time", "0")
    for k, n in totals.items():
        root.set(k, str(n))
    root.set("time", "0")
    return root


def write_junit(path: str | Path, results: Sequence[tuple], skipped: Mapping[str, str] | None = None,
                subjects: Mapping[str, dict] | None = None, errors: Mapping[str, str] | None = None) -> None:
    tree = ET.ElementTree(to_element(results, skipped, subjects, errors))
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)

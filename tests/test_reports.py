"""JUnit XML, the JSON report schema, the HTML page (rendered in headless Chromium) and progress bars."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import jsonschema
import numpy as np
import pytest
from rich.console import Console

from report_cases import VIRTUAL_FROM_KERNEL_BLOCK, small
from cpsim import cli
from cpsim.check import coordinator
from cpsim.report import report
from cpsim.allocator import allocate_world
from cpsim.report.html import picture_for, render_html, write_html
from cpsim.report.junit import write_junit
from cpsim.report.progress import progress
from cpsim.run.world import run_virtual
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

GROUP_LEVEL = set(coordinator.INVARIANTS) - {"capacity", "same-scenario", "kernel-completes"}


def checked(knobs=None):
    s = small()
    gathered = run_virtual(s, ["v1", "v2"], *([knobs] if knobs else []), runner=RUNNER)
    allocs = allocate_world(s)
    return s, gathered, allocs, coordinator.check(s, allocs, gathered, [s.fingerprint()] * s.cp.world)


@pytest.fixture(scope="module")
def healthy():
    return checked()


@pytest.fixture(scope="module")
def faulty():
    return checked(VIRTUAL_FROM_KERNEL_BLOCK)


# ---- JUnit -------------------------------------------------------------------------

def test_junit_counts(healthy, faulty, tmp_path):
    results = [(healthy[0], healthy[3]), (faulty[0].replace(name="small-fault"), faulty[3])]
    out = tmp_path / "junit.xml"
    write_junit(out, results)
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 2
    want_tests = want_fail = 0
    for (s, verdicts), suite in zip(results, suites):
        groups = len(s.groups)
        n = sum(groups if v.invariant in GROUP_LEVEL else 1 for v in verdicts)
        fails = {(v.path, x.group if v.invariant in GROUP_LEVEL else "*", v.invariant)
                 for v in verdicts for x in v.violations}
        cases = suite.findall("testcase")
        assert len(cases) == n == int(suite.get("tests"))
        assert len([c for c in cases if c.find("failure") is not None]) == len(fails) == int(suite.get("failures"))
        for c in cases:
            assert c.get("classname", "").startswith("cpsim.") and c.get("name") and float(c.get("time")) >= 0
        want_tests += n
        want_fail += len(fails)
    assert int(root.get("tests")) == want_tests and int(root.get("failures")) == want_fail
    assert int(suites[0].get("failures")) == 0 and int(suites[1].get("failures")) > 0
    owner = [c for c in suites[1].findall("testcase") if c.get("name") == "attn::owner-rule"]
    assert len(owner) == 2                                # v1 and v2
    for c in owner:
        f = c.find("failure")
        assert f is not None and "not stored on rank" in f.text and "position" in f.text
    mamba = [c for c in suites[0].findall("testcase") if c.get("name") == "mamba::owner-rule"]
    assert mamba and all(c.find("skipped") is not None for c in mamba)


# ---- JSON schema -------------------------------------------------------------------

def test_reports_validate_against_schema(healthy, faulty):
    schema = report.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for s, _, _, verdicts in (healthy, faulty):   # as written to disk (tuples become lists)
        jsonschema.validate(json.loads(json.dumps(report.to_dict(s, verdicts, {"paths_skipped": []}))), schema)
    data = json.loads(json.dumps(report.to_dict(faulty[0], faulty[3])))
    assert not data["passed"]
    bad = json.loads(json.dumps(data))
    bad["verdicts"][0]["status"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad = json.loads(json.dumps(data))
    failing = next(v for v in bad["verdicts"] if v["status"] == "fail")
    failing["violations"] = []                           # a fail without violations is malformed
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_cli_run_writes_all_reports(tmp_path):
    f = tmp_path / "s.json"
    small().dump(f)
    j, x, h = tmp_path / "r.json", tmp_path / "r.xml", tmp_path / "r.html"
    rc = cli.main(["run", "--scenario", str(f), "--paths", "v2", "--quiet",
                   "--json", str(j), "--junit", str(x), "--html", str(h)], runner=RUNNER)
    assert rc == 0
    jsonschema.validate(json.loads(j.read_text()), report.json_schema())
    assert int(ET.parse(x).getroot().get("failures")) == 0
    assert "data:image/png;base64," in h.read_text()


# ---- HTML --------------------------------------------------------------------------

def test_html_is_self_contained(faulty):
    s, gathered, allocs, verdicts = faulty
    png, note = picture_for(s, gathered, allocs, verdicts)
    assert png and png[:4] == b"\x89PNG" and not note
    page = render_html(s, verdicts, png, {"paths_skipped": []})
    assert "<script" not in page and not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    b64 = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page).group(1)
    assert base64.b64decode(b64) == png
    for v in verdicts:
        for x in v.violations:
            assert x.invariant in page
    assert "invariants violated" in page


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and this is not a root shell with apt-get to install it")
    try:
        r = subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True, timeout=900)
    except subprocess.TimeoutExpired:
        pytest.skip("apt-get install chromium timed out")
    if r.returncode != 0 or not shutil.which("chromium"):
        pytest.skip(f"apt-get install chromium failed: {r.stderr.decode()[-300:]}")
    return shutil.which("chromium")


def test_html_renders_in_headless_chromium(faulty, tmp_path):
    browser = _chromium()
    s, gathered, allocs, verdicts = faulty
    png, _ = picture_for(s, gathered, allocs, verdicts)
    page, shot = tmp_path / "report.html", tmp_path / "shot.png"
    write_html(page, s, verdicts, png)
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600",
                        f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert r.returncode == 0 and shot.exists(), r.stderr.decode()[-2000:]
    import matplotlib.image
    pixels = matplotlib.image.imread(shot)[..., :3].reshape(-1, 3)
    colours = np.unique((pixels * 255).astype(np.uint8), axis=0)
    assert len(colours) > 10                              # text, tables, the red badge: not a blank page
    red = (pixels[:, 0] > 0.6) & (pixels[:, 1] < 0.3) & (pixels[:, 2] < 0.3)
    assert red.sum() > 100                                # the "invariants violated" badge is drawn


# ---- progress ----------------------------------------------------------------------

def test_progress_quiet_unless_terminal():
    pipe = io.StringIO()
    with progress("x", total=3, console=Console(file=pipe)) as bar:
        bar.advance(3)
    assert not bar.active and bar.done == 3 and pipe.getvalue() == ""
    with progress("x", total=3, quiet=True, console=Console(file=io.StringIO(), force_terminal=True)) as bar:
        assert not bar.active
    tty = io.StringIO()
    with progress("work", total=2, console=Console(file=tty, force_terminal=True)) as bar:
        assert bar.active
        bar.advance(label="step 1")
        bar.advance()
    assert "work" in tty.getvalue() or "step 1" in tty.getvalue()

"""Issue 30: reports name the kernel under test, output fits where it lands, honest n/a.

Each test runs a small scenario through the CLI with one of tests/kernels' kernels and
reads what a user would read: the printed report, the JSON, JUnit properties, the HTML.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from rich.console import Console

from cpsim import cli
from cpsim.check.coordinator import Example, Verdict, Violation
from cpsim.report import report
from cpsim.scenario import Batch, CPConfig, KVGroup, Limits, Request, Scenario, validate
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "tests" / "kernels"
BUGGY = f"{KERNELS / 'interleave_bug_v1.py'}:_compute_slot_mapping_kernel"
CORRECT = f"{KERNELS / 'ascend_v1_abi.py'}:_compute_slot_mapping_kernel"


def newcomer() -> Scenario:
    """CP 2 with interleave 4: the interleave bug of interleave_bug_v1.py shows on every rank."""
    return validate(Scenario("newcomer-interleave", CPConfig(dcp=2, interleave=4),
                             (KVGroup("attn", "attention", 16, num_blocks=8),),
                             Limits(max_model_len=64, max_num_reqs=2, max_num_batched_tokens=32),
                             Batch((Request(0, 24, "prefill"), Request(8, 4, "decode")), (), 0)))


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("scn") / "newcomer.json"
    newcomer().dump(path)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


# ---- reports name the subject ------------------------------------------------------

@pytest.fixture(scope="module")
def user_run(scenario_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("user_run")
    paths = {k: out / f"r.{k}" for k in ("json", "xml", "html")}
    r = subprocess.run([sys.executable, "-m", "cpsim", "run", "--scenario", str(scenario_file), "--paths", "v1,v2",
                        "--kernel-v1", BUGGY, "--json", str(paths["json"]), "--junit", str(paths["xml"]),
                        "--html", str(paths["html"])], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=out)
    return r, paths


def test_every_report_names_the_users_kernel(user_run):
    r, paths = user_run
    assert r.returncode == 1, r.stderr[-2000:]
    file, sha = KERNELS / "interleave_bug_v1.py", _sha(KERNELS / "interleave_bug_v1.py")
    # the printed report: heading above the table and the column header
    head = r.stdout.split("invariant", 1)[0]
    assert f"kernel under test on v1: {BUGGY} (ascend-v1); sha256 {sha}" in head
    assert "built-in on v2" in head
    header = next(line for line in r.stdout.splitlines() if "_compute_slot_mapping_kernel" in line and "┃" in line)
    assert header.index("_compute_slot_mapping_kernel") < header.index("┃", header.index("┃") + 1) + 40
    # JSON: the subject of each path, valid against the shipped schema
    data = json.loads(paths["json"].read_text())
    jsonschema.validate(data, report.json_schema())
    assert data["subjects"]["v1"] == {"kind": "user", "spec": BUGGY, "abi": "ascend-v1", "file": str(file),
                                      "sha256": sha, "profile": "cpsim", "v2_launch": "split", "notes": []}
    assert data["subjects"]["v2"]["kind"] == "builtin" and data["subjects"]["v2"]["profile"] == "cpsim"
    # JUnit: every suite carries the properties
    suites = ET.parse(paths["xml"]).getroot().findall("testsuite")
    assert suites
    for suite in suites:
        props = {p.get("name"): p.get("value") for p in suite.find("properties")}
        assert props["cpsim.kernel.v1.sha256"] == sha and props["cpsim.kernel.v1.file"] == str(file)
        assert props["cpsim.kernel.v1.abi"] == "ascend-v1" and props["cpsim.kernel.v1.profile"] == "cpsim"
        assert props["cpsim.kernel.v2"] == "builtin"
    # HTML: the page title and the title block
    page = paths["html"].read_text()
    title = re.search(r"<title>(.*?)</title>", page).group(1)
    assert "_compute_slot_mapping_kernel" in title and "FAIL" in title
    block = page.split("<h2>", 1)[0]
    assert sha in block and str(file) in block and "ascend-v1" in block and "cpsim built-in" in block


def test_the_hash_follows_the_file(tmp_path):
    """An edited kernel gets another hash; the file is read, never imported."""
    from cpsim.kernels.subject import from_record
    k = tmp_path / "k.py"
    k.write_text("raise SystemExit('imported!')\n")
    first = from_record({"v1": {"spec": f"{k}:f", "abi": "ascend-v1"}}, ["v1"])["v1"]
    k.write_text("raise SystemExit('imported again!')\n")
    second = from_record({"v1": {"spec": f"{k}:f", "abi": "ascend-v1"}}, ["v1"])["v1"]
    assert first["sha256"] == _sha(tmp_path / "k.py") or second["sha256"] == _sha(k)
    assert first["sha256"] != second["sha256"] and len(second["sha256"]) == 16
    # a dotted module SPEC is located without running the package (json.decoder's file)
    sub = from_record({"v2": "json.decoder:JSONDecoder"}, ["v2"])["v2"]
    assert Path(sub["file"]).name == "decoder.py" and sub["sha256"] == _sha(Path(sub["file"]))


# ---- draw with the user's kernels ----------------------------------------------------

def test_draw_uses_the_users_kernel_and_a_repros_record(scenario_file, tmp_path):
    out = tmp_path / "pic.png"
    assert cli.main(["draw", "--scenario", str(scenario_file), "--paths", "v1", "--out", str(out), "--quiet"], runner=RUNNER) == 0
    assert cli.main(["draw", "--scenario", str(scenario_file), "--paths", "v1", "--kernel-v1", BUGGY,
                     "--out", str(out), "--quiet"], runner=RUNNER) == 1
    repro = tmp_path / "repro.json"
    repro.write_text(json.dumps({"scenario": newcomer().to_dict(),
                                 "kernels": {"v1": {"spec": BUGGY, "abi": "ascend-v1"}}}))
    assert cli.main(["draw", "--repro", str(repro), "--paths", "v1", "--out", str(out), "--quiet"], runner=RUNNER) == 1
    gone = tmp_path / "gone.json"
    gone.write_text(json.dumps({"scenario": newcomer().to_dict(),
                                "kernels": {"v1": {"spec": str(tmp_path / "missing.py") + ":k"}}}))
    assert cli.main(["draw", "--repro", str(gone), "--paths", "v1", "--out", str(out), "--quiet"], runner=RUNNER) == 2


# ---- output that fits where it lands -------------------------------------------------

def test_piped_output_is_not_folded(scenario_file, tmp_path):
    """stdout a pipe, no COLUMNS: a long kernel path and the table rows come out whole, one line each."""
    deep = tmp_path / ("a-rather-long-directory-name-for-a-kernel-" * 3) / "and-another-level-of-it"
    deep.mkdir(parents=True)
    kernel = deep / "interleave_bug_v1.py"
    shutil.copy(KERNELS / "interleave_bug_v1.py", kernel)
    spec = f"{kernel}:_compute_slot_mapping_kernel"
    assert len(spec) > 200
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    base = [sys.executable, "-m", "cpsim", "run", "--scenario", str(scenario_file), "--paths", "v1,v1-torch",
            "--kernel-v1", spec]
    r = subprocess.run(base, capture_output=True, text=True, timeout=600, env={**env, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert any(spec in line for line in lines), r.stdout[:3000]
    assert any(re.search(r"matches-reference\s*│\s*FAIL \d+\s*│\s*pass", line) for line in lines), r.stdout
    # the ownership table is ~120 columns wide: its rows stay whole (rank 0 holds the even positions)
    assert any(re.search(r"│ v1\s+│ attn\s+│\s+0 │\s+0 │\s+12 │\s+12 │ 0-3, 8-11, 16-19\s+│ "
                         r"0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22 +│", line) for line in lines), r.stdout
    assert "…" not in r.stdout.split("owned tokens per rank")[0]  # no cell cut short before the examples
    # --format plain: no colour codes (even where colour is forced), ASCII borders, the same facts
    r = subprocess.run([sys.executable, "-m", "cpsim", "run", "--scenario", str(scenario_file), "--paths",
                        "v1-torch", "--format", "plain"], capture_output=True, text=True, timeout=600,
                       env={**env, "PYTHONPATH": str(ROOT), "FORCE_COLOR": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\x1b[" not in r.stdout and "┃" not in r.stdout and "│" not in r.stdout
    assert re.search(r"\| matches-reference +\| +pass +\|", r.stdout) and "all invariants hold" in r.stdout


def _vio(path: str, inv: str, n: int) -> Violation:
    return Violation(inv, path, "attn", n, f"{n} token(s) not stored on rank (p // 4) % 2", [0, 1],
                     [Example(0, 0, p, "real slot on rank 0", "PAD") for p in range(n)])


def _verdicts() -> list[Verdict]:
    out = []
    for path in ("v1", "v1-torch", "v2"):
        vios = [_vio(path, "owner-rule", 5 if path == "v1" else 4)]
        out.append(Verdict("owner-rule", path, "fail", 10, vios))
        out.append(Verdict("padding", path, "pass", 10, []))
    return out


def test_failures_lead_with_a_summary_then_few_examples_once_per_agreeing_paths():
    from cpsim.presets import preset
    c = Console(record=True, width=300, color_system=None)
    report.print_report(c, preset("mtp"), _verdicts(), examples=2)
    text = c.export_text()
    summary = [line for line in text.splitlines() if line.startswith("✗")]
    assert summary == ["✗ owner-rule [v1] group attn: 5 token(s) not stored on rank (p // 4) % 2",
                       "✗ owner-rule [v1-torch, v2] group attn (same on each): 4 token(s) not stored "
                       "on rank (p // 4) % 2"]
    assert text.index("✗ owner-rule") < text.index("owner-rule [v1-torch and v2: same 4]")
    examples = [line for line in text.splitlines() if line.startswith("    rank 0")]
    assert len(examples) == 4                       # two per agreeing set of paths, not 2 x 3 paths x all
    assert "… 5 more example(s)" in text
    c = Console(record=True, width=300, color_system=None)
    report.print_report(c, preset("mtp"), _verdicts(), examples=0)
    assert not [line for line in c.export_text().splitlines() if line.startswith("    rank")]
    assert cli.main(["run", "--examples", "-1"], runner=RUNNER) == 2


def test_torchrun_prints_one_report_per_distinct_group_outcome():
    from cpsim.presets import preset
    from cpsim.report.torchrun import print_groups
    from cpsim.run.distrun import GroupResult
    s = preset("mtp")
    same = [GroupResult("mtp", g, [4 * g + i for i in range(4)], s, _verdicts()) for g in range(3)]
    c = Console(record=True, width=300, color_system=None)
    print_groups(c, same)
    text = c.export_text()
    assert text.count("invariants violated") == 1
    assert "CP group 1 (ranks 4-7): same verdicts as CP group 0" in text
    assert "CP group 2 (ranks 8-11): same verdicts as CP group 0" in text
    other = [*same[:1], GroupResult("mtp", 1, [4, 5, 6, 7], s, _verdicts()[1:])]
    c = Console(record=True, width=300, color_system=None)
    print_groups(c, other)
    assert c.export_text().count("invariants violated") == 2


# ---- honest n/a ----------------------------------------------------------------------

def test_bugs_matrix_marks_faults_that_cannot_reach_a_users_kernel_na(tmp_path, capsys):
    out = tmp_path / "m.json"
    code = cli.main(["bugs", "matrix", "--kernel-v1", CORRECT, "--faults", "short-request-rank,stale-tail",
                     "--presets", "none", "--jobs", "1", "--json", str(out)], runner=RUNNER)
    text = capsys.readouterr().out
    assert code == 0, text
    data = json.loads(out.read_text())
    assert (data["caught"], data["total"]) == (1, 1)
    cell = next(c for c in data["cells"] if c["fault"] == "short-request-rank")
    assert not cell["applicable"] and "user's" in cell["why"] and not cell["failed"]
    assert "short-request-rank" in data["not_applicable"]
    assert re.search(r"short-request-rank\s*│\s*n/a\s*│\s*n/a", text)
    assert "caught 1/1 (1 row(s) n/a" in text


def test_an_int32_abi_cannot_represent_a_trigger_past_2_31():
    from cpsim import faults
    from cpsim.faults.detect import cell_paths
    f = faults.get("int32-slot-overflow")
    user = {"v1": {"spec": CORRECT, "abi": "ascend-v1"}}
    paths, why = cell_paths(f, f.trigger(), user)
    assert "v1" not in paths and "v2" in paths and "int32" in why
    assert cell_paths(f, f.trigger(), None) == (f.paths, "")
    # an int64 ABI can hold the slots (the switch still cannot reach it, which is the other reason)
    paths, why = cell_paths(f, f.trigger(), {"v1": {"spec": CORRECT, "abi": "callable"}})
    assert "v1" not in paths and "int32" not in why and "user's" in why
    # a host-side fault reaches any kernel, whatever its ABI
    g = faults.get("table-width-not-divided")
    assert cell_paths(g, g.trigger(), {"v1": {"spec": CORRECT, "abi": "ascend-v1"}}) == (g.paths, "")


def test_inject_where_the_fault_cannot_show_is_bad_input(capsys, tmp_path):
    # the default preset has no group where the virtual block differs from B x N: the same slots
    assert cli.main(["run", "--paths", "v1-torch", "--inject", "virtual-block-uses-kernel-block", "--quiet"], runner=RUNNER) == 2
    err = capsys.readouterr().err
    assert "--inject" in err and "same slot mappings" in err and "bugs reproduce" in err
    # a switch compiled into cpsim's kernels cannot reach the user's
    trigger = tmp_path / "t.json"
    from cpsim import faults
    faults.get("short-request-rank").trigger().dump(trigger)
    assert cli.main(["run", "--scenario", str(trigger), "--paths", "v1", "--kernel-v1", CORRECT,
                     "--inject", "short-request-rank", "--quiet"], runner=RUNNER) == 2
    assert "cannot reach" in capsys.readouterr().err
    # where it shows, it is still a violation
    assert cli.main(["run", "--scenario", str(trigger), "--paths", "v1", "--inject", "short-request-rank",
                     "--quiet"], runner=RUNNER) == 1

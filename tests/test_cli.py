"""The CLI's contract: exit codes 0 / 1 / 2, readable errors, a JSON report."""

import json
import subprocess
import sys

from cpsim.cli import main
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm
from cpsim.presets import preset


def test_run_default_passes(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["run", "--json", str(out)], runner=RUNNER) == 0
    text = capsys.readouterr().out
    assert "all invariants hold" in text and "dense-local" in text
    report = json.loads(out.read_text())
    assert report["passed"] is True
    paths = {v["path"] for v in report["verdicts"]}
    assert {"v1", "v1-torch", "v2"} <= paths
    assert report["paths_skipped"] == ["v1-fused"]


def test_invalid_interleave_run_on_purpose_is_caught(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["run", "--allow-invalid", "--interleave", "48", "--paths", "v1,v2", "--json", str(out)], runner=RUNNER)
    assert code == 1
    failed = {v["invariant"] for v in json.loads(out.read_text())["verdicts"] if v["status"] == "fail"}
    assert {"dense-local", "owner-rule"} & failed


def test_invalid_interleave_is_rejected_with_a_clear_message():
    proc = subprocess.run([sys.executable, "-m", "cpsim", "run", "--interleave", "48"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "interleave 48 must divide physical block size 128" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_preset_and_path(capsys):
    assert main(["run", "--scenario", "nope"], runner=RUNNER) == 2
    assert main(["run", "--paths", "v3"], runner=RUNNER) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "v3" in err


def test_scenario_file(tmp_path):
    path = tmp_path / "s.toml"
    preset("default", dcp=1).dump(path)
    assert main(["run", "--scenario", str(path), "--quiet"], runner=RUNNER) == 0

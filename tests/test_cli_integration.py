"""Cross-cutting options on every command: kernels under test, --html, torchrun for replay / bugs reproduce.

The broken kernel is our ascend-v1 test kernel with vllm-ascend #11774 put back
(padding starts at the padded token count), so scenarios with graph padding
(hybrid-mamba, the stale-tail trigger) fail ``padding`` with it and pass without.
"""

from __future__ import annotations

import json
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cpsim import cli, faults
from cpsim import fuzz as fz
from test_dist import _env, cpu_sim
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

HERE = Path(__file__).parent
GOOD_V1 = f"{HERE}/kernels/ascend_v1_abi.py:_compute_slot_mapping_kernel"


@pytest.fixture(scope="module")
def broken_v1(tmp_path_factory) -> str:
    text = (HERE / "kernels" / "ascend_v1_abi.py").read_text()
    old = "pad_from = tl.load(query_start_loc_ptr + req)"
    assert text.count(old) == 1
    f = tmp_path_factory.mktemp("kernels") / "stale_tail_v1.py"
    f.write_text(text.replace(old, "pad_from = num_tokens"))
    return f"{f}:_compute_slot_mapping_kernel"


class _Tables(HTMLParser):
    """Every table row of a page as a list of cell texts."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self.rows:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def html_rows(path: Path, first: str) -> list[list[str]]:
    p = _Tables()
    p.feed(path.read_text())
    return [r for r in p.rows if r and r[0] == first]


# ---- kernels under test ------------------------------------------------------------

def test_sweep_runs_the_kernel_under_test_and_writes_one_html_page(tmp_path, broken_v1, capsys):
    args = ["sweep", "--presets", "hybrid-mamba", "--cp", "1,2", "--paths", "v1", "--quiet"]
    assert cli.main(args + ["--kernel-v1", GOOD_V1], runner=RUNNER) == 0
    page = tmp_path / "sweep.html"
    assert cli.main(args + ["--kernel-v1", broken_v1, "--html", str(page)], runner=RUNNER) == 1
    assert "2 of 2 scenario run(s) fail" in capsys.readouterr().out
    # One page: the summary lists both scenarios, each scenario's table fails padding on v1.
    summary = [r for r in html_rows(page, "hybrid-mamba cp1 [seed 0] · ranks 0-0")
               + html_rows(page, "hybrid-mamba cp2 [seed 0] · ranks 0-1")]
    assert len(summary) == 2 and all(r[-1].startswith("FAIL") for r in summary), summary
    padding = html_rows(page, "padding")
    assert len(padding) == 2 and all(r[1].startswith("FAIL") for r in padding), padding
    assert [r[1] for r in html_rows(page, "no-collision")] == ["pass", "pass"]


def test_sweep_rejects_a_kernel_for_an_unselected_path(capsys):
    assert cli.main(["sweep", "--paths", "v2", "--kernel-v1", GOOD_V1], runner=RUNNER) == 2
    assert "--kernel-v1" in capsys.readouterr().err


@pytest.mark.parametrize("good", [True, False], ids=["good-kernel", "broken-kernel"])
def test_bugs_matrix_with_a_kernel_under_test(tmp_path, broken_v1, good):
    out = tmp_path / "m.json"
    code = cli.main(["bugs", "matrix", "--presets", "none", "--faults", "stale-tail", "--jobs", "1",
                     "--kernel-v1", GOOD_V1 if good else broken_v1, "--json", str(out)], runner=RUNNER)
    (cell,) = json.loads(out.read_text())["cells"]
    if good:  # the built-in paths still carry the fault; the user's v1 kernel is clean
        assert code == 0 and cell["caught"] and not cell["baseline_failed"]
    else:     # the fault-free trigger already fails, on v1 only: the kernel's own bug
        assert code == 1 and not cell["caught"]
        assert cell["baseline_failed"]["padding"] == ["v1"]


def test_fuzz_records_the_kernel_and_replay_reloads_or_overrides_it(tmp_path, broken_v1, capsys):
    out = tmp_path / "out"
    assert cli.main(["fuzz", "--paths", "v1", "--kernel-v1", broken_v1, "--max-examples", "100", "--seed", "0",
                     "--stop-after-first", "--no-db", "--out", str(out), "--quiet"], runner=RUNNER) == 1
    (repro,) = out.glob("repro-*.json")
    data = json.loads(repro.read_text())
    assert data["kernels"] == {"v1": {"spec": broken_v1, "abi": "ascend-v1", "v2_launch": "split",
                                      "shim_vllm": False}}
    assert "padding" in data["violation"]["invariants"]
    capsys.readouterr()
    page = tmp_path / "replay.html"
    assert cli.main(["replay", str(repro), "--html", str(page)], runner=RUNNER) == 1   # the recorded (broken) kernel
    assert f"kernel under test on v1: {broken_v1}" in capsys.readouterr().out.replace("\n", "")
    assert html_rows(page, "padding")[0][1].startswith("FAIL")
    assert cli.main(["replay", str(repro), "--kernel-v1", GOOD_V1, "--quiet"], runner=RUNNER) == 0
    assert cli.main(["replay", str(repro), "--kernel-v1", "builtin", "--quiet"], runner=RUNNER) == 0


def test_replay_of_an_old_repro_without_kernels_uses_the_builtin_ones(tmp_path):
    f = faults.get("stale-tail")
    s = f.trigger()
    path = fz.write_repro(tmp_path, fz.Repro(s, ["v1"], f.knobs_for(s), f.name, {"invariants": ["padding"]}))
    data = json.loads(path.read_text())
    assert data["kernels"] == {"v1": "builtin"}
    del data["kernels"]
    path.write_text(json.dumps(data))
    assert cli.main(["replay", str(path), "--quiet"], runner=RUNNER) == 1


# ---- --html on bugs reproduce ------------------------------------------------------------

def test_bugs_reproduce_writes_html_with_the_violation(tmp_path):
    page, fixed = tmp_path / "bug.html", tmp_path / "fixed.html"
    assert cli.main(["bugs", "reproduce", "stale-tail", "--paths", "v1,v2", "--html", str(page)], runner=RUNNER) == 1
    assert [r[1:3] for r in html_rows(page, "padding")] == [["FAIL 3", "FAIL 3"]]
    text = page.read_text()
    assert "data:image/png;base64," in text and "<code>padding</code>" in text
    assert cli.main(["bugs", "reproduce", "stale-tail", "--paths", "v1,v2", "--fixed", "--html", str(fixed)], runner=RUNNER) == 0
    assert [r[1:3] for r in html_rows(fixed, "padding")] == [["pass", "pass"]]


# ---- torchrun: argument checks that need no processes -----------------------------------

def test_torchrun_world_must_hold_whole_cp_groups(tmp_path, monkeypatch, capsys):
    f = faults.get("virtual-block-uses-kernel-block")
    s = f.trigger()
    assert s.cp.world > 1 and 3 % s.cp.world
    path = fz.write_repro(tmp_path, fz.Repro(s, ["v1"], f.knobs_for(s), f.name, {}))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert cli.main(["replay", str(path), "--device", "cpu"], runner=RUNNER) == 2
    err = capsys.readouterr().err
    assert "world size 3" in err and f"CP size {s.cp.world}" in err
    assert cli.main(["bugs", "reproduce", f.name, "--device", "cpu"], runner=RUNNER) == 2
    err = capsys.readouterr().err
    assert "world size 3" in err and f"CP size {s.cp.world}" in err


def test_launch_scripts_accept_only_bugs_reproduce():
    proc = subprocess.run([str(HERE.parent / "launch" / "cpu-sim.sh"), "2", "bugs", "matrix"], env=_env(),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "only `bugs reproduce NAME`" in proc.stderr


# ---- torchrun: real processes ------------------------------------------------------------------

@pytest.mark.dist
@pytest.mark.e2e
def test_bugs_reproduce_under_torchrun(tmp_path):
    out = tmp_path / "r.json"
    proc = cpu_sim(2, "bugs", "reproduce", "stale-tail", "--paths", "v1,v2", "--json", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["world_size"] == 2 and len(report["groups"]) == 2 and report["fault"] == "stale-tail"
    for g in report["groups"]:
        failed = {(v["invariant"], v["path"]) for v in g["verdicts"] if v["status"] == "fail"}
        assert {("padding", "v1"), ("padding", "v2")} <= failed
    assert "bug reproduced" in proc.stdout
    proc = cpu_sim(2, "bugs", "reproduce", "stale-tail", "--paths", "v1,v2", "--fixed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fixed: every invariant holds" in proc.stdout


@pytest.mark.dist
@pytest.mark.e2e
def test_replay_under_torchrun(tmp_path):
    f = faults.get("stale-tail")
    s = f.trigger()
    repro = fz.write_repro(tmp_path, fz.Repro(s, ["v2"], f.knobs_for(s), f.name, {"invariants": ["padding"]}))
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    proc = cpu_sim(2, "replay", str(repro), "--json", str(out), "--html", str(page))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert [g["ranks"] for g in report["groups"]] == [[0], [1]]
    assert all({v["invariant"] for v in g["verdicts"] if v["status"] == "fail"} >= {"padding"}
               for g in report["groups"])
    assert "violation reproduced" in proc.stdout
    assert [r[1] for r in html_rows(page, "padding")] == ["FAIL 3", "FAIL 3"]

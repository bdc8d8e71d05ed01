"""cpsim run --stack: the runtime's host classes driven per CP rank in a child, judged by the coordinator;
capture from the host classes, replayed.

Host classes of our own in vllm-ascend's shape (tests/stack_hosts) run without vLLM; the tests on
released classes skip unless the side environment of scripts/upstream_install.py (and, for vllm-ascend,
the unpacked sdist) is there, by default under .venv-upstream:
$CPSIM_STACK_PYTHON (the shared base venv's python) with $CPSIM_STACK_SOURCE (vLLM 0.33.0's --target
folder; empty when that python has vLLM 0.33.0 installed), $CPSIM_ASCEND_PYTHON (base python),
$CPSIM_ASCEND_SOURCE_023 / _018 / _013 (the vllm-ascend sdists' top folders) beside
$CPSIM_ASCEND_VLLM_023 / _018 / _013 (the folders of vLLM 0.23.0 / 0.18.0 / 0.13.0, each built-for pair).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cpsim import cli
from cpsim.presets import preset
from cpsim.stack import host
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

HOSTS = Path(__file__).parent / "stack_hosts"
ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / ".venv-upstream"
BASE_PYTHON = str(UPSTREAM / "base" / "bin" / "python")
VLLM_PYTHON = os.environ.get(host.PYTHON_ENV, BASE_PYTHON)
VLLM_FOLDER = os.environ.get("CPSIM_STACK_SOURCE", str(UPSTREAM / "vllm-0.33.0"))
ASCEND_PYTHON = os.environ.get("CPSIM_ASCEND_PYTHON", BASE_PYTHON)
PAIRS = {"0.23.0.post1": ("023", "0.23.0"), "0.18.0": ("018", "0.18.0"), "0.13.0": ("013", "0.13.0")}
ASCEND_SDIST = {r: os.environ.get(f"CPSIM_ASCEND_SOURCE_{tag}", str(UPSTREAM / "src" / f"vllm_ascend-{r}"))
                for r, (tag, _) in PAIRS.items()}
ASCEND_VLLM = {r: os.environ.get(f"CPSIM_ASCEND_VLLM_{tag}", str(UPSTREAM / f"vllm-{v}")) for r, (tag, v) in PAIRS.items()}
# --stack-source of each release: the sdist first, then the folder of the vLLM release it was built for
ASCEND_SOURCE = {r: os.pathsep.join([ASCEND_SDIST[r]] + [ASCEND_VLLM[r]] * bool(ASCEND_VLLM[r])) for r in PAIRS}
VLLM_READY = Path(VLLM_PYTHON).exists() and (not VLLM_FOLDER or (Path(VLLM_FOLDER) / "vllm").is_dir())
VLLM_SKIP = (f"no side environment with vLLM 0.33.0 at {VLLM_PYTHON} + {VLLM_FOLDER!r} "
             f"(scripts/upstream_install.py, or set {host.PYTHON_ENV} / CPSIM_STACK_SOURCE)")


def vllm_args() -> list[str]:
    return ["--stack-python", VLLM_PYTHON] + (["--stack-source", VLLM_FOLDER] if VLLM_FOLDER else [])


def run(tmp_path, *argv) -> tuple[int, dict]:
    out = tmp_path / "r.json"
    code = cli.main(["run", "--quiet", "--json", str(out), *argv], runner=RUNNER)
    return code, (json.loads(out.read_text()) if out.exists() else {})


def failing(report: dict) -> set[str]:
    return {v["invariant"] for v in report["verdicts"] if v["status"] == "fail"}


def own(name: str) -> list[str]:
    return ["--stack", "vllm-ascend", "--paths", "v1", "--stack-python", sys.executable,
            "--stack-classes", str(HOSTS / f"{name}.py")]


def test_own_classes_in_the_ascend_shape_pass(tmp_path):
    code, rep = run(tmp_path, *own("ascend_shape"))
    assert (code, failing(rep)) == (0, set())
    assert "ascend_shape (correct)" in rep["stack"]["release"]


@pytest.mark.parametrize("bug, invariants", [
    ("mamba_width_div_cp", {"block-sizing"}),           # vllm-ascend #9724
    ("no_draft_reserve", {"capacity"}),                 # vllm-ascend #14024
    ("kernel_block_in_virtual", {"dense-local", "matches-reference"}),  # vllm-ascend #10442
])
def test_each_upstream_host_bug_is_a_failing_run(tmp_path, bug, invariants):
    code, rep = run(tmp_path, *own(bug))
    assert code == 1
    assert invariants <= failing(rep)


def test_a_scenario_the_release_cannot_express_is_exit_2(tmp_path, capsys):
    code, _ = run(tmp_path, "--scenario", "hybrid-mamba", *own("ascend_shape"))
    assert code == 2
    assert "groups.swa.kind" in capsys.readouterr().err


def hostile(tmp_path, deed: str, on_rank: int = 0) -> Path:
    """Our ascend-shape classes whose compute_slot_mapping does ``deed`` on CP rank ``on_rank``."""
    bad = tmp_path / "hostile.py"
    bad.write_text(f"import sys\nsys.path.insert(0, {str(HOSTS)!r})\nfrom ascend_shape import *\n"
                   "import os, signal, time, ascend_shape\n"
                   "good = ascend_shape.BlockTable.compute_slot_mapping\n"
                   "def deed(self, *a):\n"
                   f"    if self.dcp_rank == {on_rank}:\n"
                   f"        {deed}\n"
                   "    return good(self, *a)\n"
                   "ascend_shape.BlockTable.compute_slot_mapping = deed\n")
    return bad


@pytest.mark.parametrize("deed, kind", [
    ("os._exit(0)", "exited 0 before answering"),
    ("os.kill(os.getpid(), signal.SIGSEGV)", "died of SIGSEGV"),
    ("raise ValueError('boom')", "ValueError: boom"),
])
def test_host_code_that_dies_is_kernel_completes_failed_on_its_rank(tmp_path, deed, kind):
    code, rep = run(tmp_path, "--stack", "vllm-ascend", "--paths", "v1", "--stack-python", sys.executable,
                    "--stack-classes", str(hostile(tmp_path, deed, on_rank=1)))
    assert code == 1
    (kc,) = [v for v in rep["verdicts"] if v["invariant"] == "kernel-completes"]
    assert kc["status"] == "fail" and kc["violations"][0]["ranks"] == [1]
    assert kind in kc["violations"][0]["message"] and "rank 1" in kc["violations"][0]["message"]


def _lying_python(tmp_path) -> list[str]:
    """A --stack-python that prints a fake pass and exits 0 without running the driver."""
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\necho pass\nexit 0\n")
    py.chmod(0o755)
    return ["--stack", "vllm", "--dcp", "2", "--stack-python", str(py)]


@pytest.mark.parametrize("ending, argv, code", [
    ("a pass", lambda tmp: own("ascend_shape"), 0),
    ("a violation", lambda tmp: own("mamba_width_div_cp"), 1),
    ("host code that dies", lambda tmp: ["--stack", "vllm-ascend", "--paths", "v1", "--stack-python", sys.executable,
                                         "--stack-classes", str(hostile(tmp, "os.kill(os.getpid(), signal.SIGSEGV)"))],
     1),
    ("a lying --stack-python", _lying_python, 1),
])
def test_every_requested_report_is_written_on_every_ending(tmp_path, ending, argv, code):
    """--json, --junit and --html of the stack route, as plain ``cpsim run`` writes them; each says the verdict."""
    import xml.etree.ElementTree as ET
    files = {flag: tmp_path / f"r.{flag[2:]}" for flag in ("--junit", "--html")}
    got, rep = run(tmp_path, *argv(tmp_path), *[x for flag, f in files.items() for x in (flag, str(f))])
    assert got == code and rep["passed"] is (code == 0), ending
    suite = ET.parse(files["--junit"]).getroot()
    assert (int(suite.get("failures")) > 0) is (code == 1), ending
    assert sorted({c.get("name").split("::")[-1] for c in suite.iter("testcase") if c.find("failure") is not None}) \
        == sorted(failing(rep)), ending
    page = files["--html"].read_text()
    assert ("invariants violated" if code else "all invariants hold") in page, ending
    assert all(inv in page for inv in failing(rep)), ending


def test_a_hung_job_is_killed_and_the_next_job_still_judged(tmp_path):
    mark = tmp_path / "hung-once"  # the first job to get here hangs, every later one runs
    hang = hostile(tmp_path, f"time.sleep(3600) if not os.path.exists({str(mark)!r}) and not "
                             f"open({str(mark)!r}, 'w').close() else None")
    _, _, (j0, j1) = host.drive_many([preset("default"), preset("default")], "vllm-ascend", ["v1"],
                                     sys.executable, classes=str(hang), job_timeout=5)
    assert j0.failures["v1"].kind == "timeout" and not j0.steps
    _, verdicts = host.judge_steps(j1.steps, None, j1.failures)
    assert not j1.failures and not [v for v in verdicts if v.status == "fail"]


def test_kv_manager_blocks_are_shared_by_ranks_and_never_the_null_block():
    s = preset("default", dcp=4)
    for gi, g in enumerate(s.groups):
        per_req = host.kv_manager_blocks(s, gi)
        assert all(len(b) == 0 or b.min() >= 1 for b in per_req)
        lens = s.batch.allocated_lens()
        want = [0 if n <= 0 else (1 if g.kind == "mamba" else -(-n // (g.block_size * 4))) for n in lens]
        assert [len(b) for b in per_req] == want


# Findings on the unmodified release beyond the universal ones: none since the vllm-0.33 profile models the
# draft reserve of its slot buffer and MRV2's slot-computed mamba groups (docs/UPSTREAM.md, data/upstream/known.json).
VLLM_033_KNOWN: set[tuple[str, str]] = set()


@pytest.mark.skipif(not VLLM_READY, reason=VLLM_SKIP)
def test_installed_vllm_classes_hold_every_universal_invariant(tmp_path):
    code, rep = run(tmp_path, "--stack", "vllm", "--dcp", "4", *vllm_args())
    assert rep["stack"]["release"] == "vllm 0.33.0"
    fails = {(v["invariant"], v["path"]) for v in rep["verdicts"] if v["status"] == "fail"}
    assert not {f for f in fails if f[0] in host.UNIVERSAL}
    assert fails == VLLM_033_KNOWN and code == (1 if VLLM_033_KNOWN else 0)


VLLM_023 = os.environ.get("CPSIM_STACK_SOURCE_023", str(UPSTREAM / "vllm-0.23.0"))


@pytest.mark.skipif(not (Path(VLLM_PYTHON).exists() and (Path(VLLM_023) / "vllm").is_dir()),
                    reason=f"no vLLM 0.23.0 folder at {VLLM_023} (scripts/upstream_install.py, or set "
                           f"CPSIM_STACK_SOURCE_023) or no base python at {VLLM_PYTHON}")
def test_vllm_023_host_classes_hold_every_invariant_on_default(tmp_path):
    """vLLM 0.23.0's v1 MultiGroupBlockTable (max_model_len, no slot-mapping modes) and MRV2 BlockTables
    (the runner's widths, kernel block sizes), each judged by its profile range."""
    code, rep = run(tmp_path, "--stack", "vllm", "--dcp", "4", "--stack-python", VLLM_PYTHON,
                    "--stack-source", VLLM_023)
    assert rep["stack"]["release"] == "vllm 0.23.0"
    assert (code, failing(rep)) == (0, set())


def test_install_puts_beside_a_release_only_what_the_base_does_not_satisfy(tmp_path):
    """upstream_install.unmet: a requirement the base python satisfies is not installed again; one it does
    not (too old, absent) is; a dist in the release's folder shadows the base's (it is what that job imports);
    a marker that does not apply is no requirement."""
    spec = importlib.util.spec_from_file_location("upstream_install", ROOT / "scripts" / "upstream_install.py")
    ui = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ui)
    assert ui.unmet(sys.executable, tmp_path, ["pytest", "numpy>=1", "numpy<1; python_version < '3'"]) == []
    assert ui.unmet(sys.executable, tmp_path, ["pytest>=999", "no-such-dist-cpsim"]) == \
        ["pytest>=999", "no-such-dist-cpsim"]
    (tmp_path / "pytest-999.0.dist-info").mkdir()
    (tmp_path / "pytest-999.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: pytest\nVersion: 999.0\n")
    assert ui.unmet(sys.executable, tmp_path, ["pytest>=999", "pytest<999"]) == ["pytest<999"]


# ---- vllm-ascend's released classes (v1 MultiGroupBlockTable), driven per rank --------------------------

def _ascend_ready(release: str) -> tuple[bool, str]:
    py, src, folder = ASCEND_PYTHON, ASCEND_SDIST[release], ASCEND_VLLM[release]
    ok = Path(py).exists() and (Path(src) / "vllm_ascend" / "worker" / "block_table.py").exists() and \
        (not folder or (Path(folder) / "vllm").is_dir())
    return ok, (f"needs the base python at {py} ($CPSIM_ASCEND_PYTHON), vLLM {PAIRS[release][1]}'s folder at "
                f"{folder!r} and vllm-ascend {release}'s unpacked sdist at {src} (docs/UPSTREAM.md)")


def _ascend_sweep(release: str, presets=("default",), path: str = "v1") -> dict[str, set[tuple[str, str]]]:
    """DCP 2/4/8 x interleave 1/16 of each preset through one child: {scenario: {(invariant, group)} failing}."""
    import dataclasses

    scen = [dataclasses.replace(preset(p, dcp=d, interleave=i), name=f"{p}-dcp{d}-i{i}")
            for p in presets for d in (2, 4, 8) for i in (1, 16)]
    got, _, jobs = host.drive_many(scen, "vllm-ascend", [path], ASCEND_PYTHON, source=ASCEND_SOURCE[release])
    assert got == f"vllm-ascend {release} (vLLM {PAIRS[release][1]})"
    out = {}
    for j in jobs:
        assert j.unsupported is None
        assert j.profile_of(path) == ("vllm-ascend-0.23" if path == "v1" else "vllm-0.26")
        _, verdicts = host.judge_steps(j.steps, j.profile_of(path))
        out[j.scenario.name] = {(v.invariant, x.group) for v in verdicts if v.status == "fail" for x in v.violations}
    return out


# On main the vllm-ascend-0.23 profile's padding reach ("padded-count": the runner PADs up to the padded
# count, model_runner_v1.py) is not applied yet, so the buffer tail past it reads as `padding` /
# `matches-reference` on the slot-mapped groups; nothing else may fail.
TAIL = {"padding", "matches-reference"}


@pytest.mark.skipif(not _ascend_ready("0.23.0.post1")[0], reason=_ascend_ready("0.23.0.post1")[1])
def test_installed_vllm_ascend_023_holds_every_universal_invariant():
    for name, fails in _ascend_sweep("0.23.0.post1").items():
        assert {inv for inv, _ in fails} <= TAIL, name
        assert {g for _, g in fails} <= {"attn-hybrid", "attn-b16"}, name


@pytest.mark.skipif(not _ascend_ready("0.18.0")[0], reason=_ascend_ready("0.18.0")[1])
def test_installed_vllm_ascend_018_shows_the_mamba_width_divided_by_cp():
    """0.18.0 sizes a mamba table cdiv(max_model_len, B x CP) and never multiplies it back (vllm-ascend #9724,
    fixed in 0.23.0.post1's BlockTable): block-sizing on the mamba group at every DCP, nothing universal."""
    for name, fails in _ascend_sweep("0.18.0").items():
        assert ("block-sizing", "mamba") in fails, name
        assert {inv for inv, _ in fails} <= TAIL | {"block-sizing"}, name


@pytest.mark.skipif(not _ascend_ready("0.23.0.post1")[0], reason=_ascend_ready("0.23.0.post1")[1])
def test_installed_vllm_ascend_023_int32_slots_wrap_past_2_31(tmp_path):
    """huge-cache: 33554432 blocks x 128 slots; 0.23.0.post1's slot buffer is int32 (reshape_and_cache wants
    int32), so slots past 2^31 wrap negative: dense-local and no-collision fail on that group."""
    code, rep = run(tmp_path, "--stack", "vllm-ascend", "--paths", "v1", "--scenario", "huge-cache", "--dcp", "4",
                    "--stack-python", ASCEND_PYTHON, "--stack-source", ASCEND_SOURCE["0.23.0.post1"])
    fails = {(v["invariant"], x["group"]) for v in rep["verdicts"] if v["status"] == "fail" for x in v["violations"]}
    assert code == 1
    assert {("dense-local", "attn-b128"), ("no-collision", "attn-b128")} <= fails
    assert ("dense-local", "attn-b16") not in fails


@pytest.mark.skipif(not _ascend_ready("0.13.0")[0], reason=_ascend_ready("0.13.0")[1])
def test_installed_vllm_ascend_013_ships_the_host_bugs_of_018(tmp_path):
    """0.13.0's other constructor (it sizes every group itself: max(cdiv(max_model_len, B x CP), 1 + spec),
    the mamba group too) beside vLLM 0.13.0: the #9724 width at every DCP, #10442 on hybrid-interleave and
    #14024 on mtp, as 0.18.0; nothing else fails on default."""
    for name, fails in _ascend_sweep("0.13.0").items():
        assert ("block-sizing", "mamba") in fails and {inv for inv, _ in fails} == {"block-sizing"}, name
    code, fails = _ascend_run(tmp_path, "0.13.0", "hybrid-interleave")
    assert code == 1 and {"owner-rule", "dense-local", "no-collision"} <= fails
    code, fails = _ascend_run(tmp_path, "0.13.0", "mtp")
    assert code == 1 and "kernel-completes" in fails


@pytest.mark.skipif(not (_ascend_ready("0.18.0")[0] and _ascend_ready("0.23.0.post1")[0]),
                    reason=_ascend_ready("0.18.0")[1])
def test_installed_vllm_ascend_v2_host_classes(tmp_path, capsys):
    """AscendBlockTables as vLLM's own MRV2 runner builds it (0.23.0.post1 beside vLLM 0.23.0, 0.18.0 beside
    0.18.0): universal invariants hold on decode-heavy at every DCP / interleave; 0.23.0.post1's kernel-block
    virtual block breaks the owner rule on hybrid-interleave where 0.18.0's physical one holds; a mamba group
    on 0.18.0's MRV2 (which has none) and v2 on 0.13.0 (no such class) are exit 2."""
    for release in ("0.18.0", "0.23.0.post1"):
        for name, fails in _ascend_sweep(release, ("decode-heavy",), path="v2").items():
            assert not {inv for inv, _ in fails} & set(host.UNIVERSAL), (release, name)
    code, fails = _ascend_run(tmp_path, "0.23.0.post1", "hybrid-interleave", "v2")
    assert code == 1 and {"owner-rule", "dense-local", "no-collision"} <= fails
    code, fails = _ascend_run(tmp_path, "0.18.0", "hybrid-interleave", "v2")
    assert not fails & set(host.UNIVERSAL)
    capsys.readouterr()
    assert _ascend_run(tmp_path, "0.18.0", "default", "v2")[0] == 2
    assert "has no mamba (state) groups" in capsys.readouterr().err
    if _ascend_ready("0.13.0")[0]:
        assert _ascend_run(tmp_path, "0.13.0", "default", "v2")[0] == 2
        assert "no vllm_ascend/worker/v2/block_table.py" in capsys.readouterr().err


def _fake_ascend(tmp_path, version: str, block_table: str) -> Path:
    pkg = tmp_path / "src" / "vllm_ascend"
    (pkg / "worker").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_version.py").write_text(f"__version__ = {version!r}\n")
    (pkg / "worker" / "__init__.py").write_text("")
    (pkg / "worker" / "block_table.py").write_text(block_table)
    return tmp_path / "src"


def test_a_vllm_ascend_release_not_read_is_judged_and_one_that_does_not_load_is_exit_2(tmp_path, capsys):
    """An unlisted release is no longer refused for its version: it is driven by the nearest listed release's
    rules; this one's block table does not import (no vLLM in this python): exit 2, one line, not a violation."""
    src = _fake_ascend(tmp_path, "9.9.9", "")
    code, _ = run(tmp_path, "--stack", "vllm-ascend", "--paths", "v1", "--stack-python", sys.executable,
                  "--stack-source", str(src))
    assert code == 2
    err = capsys.readouterr().err
    assert "not a release this adapter was read from" not in err
    assert "vllm-ascend 9.9.9's block_table does not import" in err and "Traceback" not in err


def test_a_vllm_ascend_that_does_not_import_is_exit_2_with_the_reason(tmp_path, capsys):
    src = _fake_ascend(tmp_path, "0.23.0.post1", "import torch_npu\n")
    code, _ = run(tmp_path, "--stack", "vllm-ascend", "--paths", "v1", "--stack-python", sys.executable,
                  "--stack-source", str(src))
    err = capsys.readouterr().err
    assert code == 2
    assert "does not import here" in err and "ModuleNotFoundError" in err


def test_stack_under_torchrun_needs_whole_cp_groups(tmp_path, capsys, monkeypatch):
    """Under torchrun each rank drives one CP rank (tests/test_stack_torchrun.py): a world that is not
    a multiple of the CP size is exit 2 naming the field, before any process group."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    code, _ = run(tmp_path, "--dcp", "2", *own("ascend_shape"))
    assert code == 2
    err = capsys.readouterr().err
    assert "--dcp/--pcp" in err and "world size 3" in err and "Traceback" not in err


def test_a_missing_stack_source_is_exit_2(tmp_path, capsys):
    code, _ = run(tmp_path, *own("ascend_shape"), "--stack-source", str(tmp_path / "nowhere"))
    assert code == 2
    assert "--stack-source" in capsys.readouterr().err
    # a list of folders (an sdist beside a vLLM --target folder): each must exist
    code, _ = run(tmp_path, *own("ascend_shape"), "--stack-source", os.pathsep.join([str(tmp_path), "/no/vllm"]))
    assert code == 2
    assert "/no/vllm is not a folder" in capsys.readouterr().err
    assert host.stack_source(os.pathsep.join([str(tmp_path), str(HOSTS)])) == [str(tmp_path), str(HOSTS)]


def test_one_path_the_adapter_refuses_is_named_and_the_other_still_judged(tmp_path, capsys):
    """Own classes are driven on v1 only: a job for v1 and v2 answers v2 as not expressible with its rule and
    judges v1; a single run asked for both is exit 2 (it judges every path it was asked for, or none)."""
    _, _, (job,) = host.drive_many([preset("default")], "vllm-ascend", ["v1", "v2"], sys.executable,
                                   classes=str(HOSTS / "ascend_shape.py"))
    assert job.unsupported is None and set(job.steps) == {"v1"}
    assert job.unsupported_paths["v2"][0] == "--paths" and "v1 only" in job.unsupported_paths["v2"][1]
    _, verdicts = host.judge_steps(job.steps, job.profile_of("v1"))
    assert verdicts and not [v for v in verdicts if v.status == "fail"]
    code, _ = run(tmp_path, "--stack", "vllm-ascend", "--paths", "v1,v2", "--stack-python", sys.executable,
                  "--stack-classes", str(HOSTS / "ascend_shape.py"))
    assert code == 2 and "--paths" in capsys.readouterr().err


# ---- capture from the host classes ----------------------------------------------------------------------

def _replay(path, tmp_path) -> tuple[int, dict]:
    out = tmp_path / "replay.json"
    code = cli.main(["replay", str(path), "--quiet", "--json", str(out)], runner=RUNNER)
    return code, (json.loads(out.read_text()) if out.exists() else {})


def _capture_own(tmp_path, module: str) -> Path:
    out = tmp_path / f"cap-{module}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, str(HOSTS / "capture_run.py"), module, str(out)], check=True, env=env,
                   timeout=300)
    return out


def test_capture_from_own_host_classes_replays_clean(tmp_path):
    cap = _capture_own(tmp_path, "ascend_shape")
    assert sorted(p.name for p in cap.iterdir()) == [f"rank{r}.cpcap" for r in range(4)]
    code, rep = _replay(cap, tmp_path)
    assert (code, rep.get("passed"), rep.get("steps_checked")) == (0, True, 1)


def test_capture_from_host_classes_keeps_block_0_by_its_live_count(tmp_path):
    """Request 0's only block of group 0 is block 0: with the recorded num_blocks it is a block; without them
    (read off the row, up to the last non-zero id) the row is empty and the replay fails."""
    from cpsim.capture.archive import ArchiveReader, ArchiveWriter
    cap = _capture_own(tmp_path, "ascend_shape")
    assert _replay(cap, tmp_path)[0] == 0
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in cap.iterdir():
        r = ArchiveReader(f, "capture")
        w = ArchiveWriter(bare / f.name)
        for name in sorted(r.names):
            if "num_blocks" in name:
                continue
            if name.endswith(".json"):
                w.json(name[: -len(".json")], r.json(name[: -len(".json")]))
            else:
                w.array(name[: -len(".npy")], r.array(name[: -len(".npy")]))
        w.close()
    code, rep = _replay(bare, tmp_path)
    assert code == 1
    assert rep["first_violation"]["invariant"] in {"row-bounds", "dense-local", "matches-reference"}


def test_capture_from_host_classes_with_an_upstream_bug_fails_replay(tmp_path):
    code, rep = _replay(_capture_own(tmp_path, "kernel_block_in_virtual"), tmp_path)  # vllm-ascend #10442
    assert code == 1
    assert {"dense-local", "no-collision"} <= failing(rep)


@pytest.mark.skipif(not VLLM_READY, reason=VLLM_SKIP)
@pytest.mark.parametrize("path", ["v1", "v2"])
def test_capture_from_vllm_033_real_classes_replays(tmp_path, path):
    """examples/capture_vllm_host.py: vLLM 0.33.0's MultiGroupBlockTable / BlockTables per rank, captured;
    the replay holds; with rank 1 handed other positions (--break) it fails."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [VLLM_FOLDER] * bool(VLLM_FOLDER)))
    for broken in (False, True):
        cap = tmp_path / f"cap-{path}-{broken}"
        subprocess.run([VLLM_PYTHON, str(ROOT / "examples" / "capture_vllm_host.py"), str(cap), path]
                       + (["--break"] if broken else []), check=True, env=env, timeout=600, capture_output=True)
        code, rep = _replay(cap, tmp_path)
        if not broken:
            assert (code, rep.get("passed")) == (0, True)
        else:
            assert code == 1 and "same-scenario" in failing(rep)


def _ascend_run(tmp_path, release: str, preset: str, path: str = "v1") -> tuple[int, set[str]]:
    code, rep = run(tmp_path, "--stack", "vllm-ascend", "--paths", path, "--scenario", preset, "--dcp", "4",
                    "--stack-python", ASCEND_PYTHON, "--stack-source", ASCEND_SOURCE[release])
    return code, (failing(rep) if rep else set())


@pytest.mark.skipif(not (_ascend_ready("0.18.0")[0] and _ascend_ready("0.23.0.post1")[0]),
                    reason=_ascend_ready("0.18.0")[1])
def test_vllm_ascend_018_ships_the_two_host_bugs_023_fixed(tmp_path, capsys):
    """On the released code itself: 0.18.0's virtual block is the kernel block x CP (vllm-ascend #10442: wrong
    owners once the interleave exceeds the kernel block, hybrid-interleave) and its slot buffer has no MTP draft
    reserve (#14024: the release raises on mtp's 110 tokens in 104 entries); 0.23.0.post1 holds both."""
    code, fails = _ascend_run(tmp_path, "0.18.0", "hybrid-interleave")
    assert code == 1 and {"owner-rule", "dense-local", "no-collision"} <= fails
    code, fails = _ascend_run(tmp_path, "0.23.0.post1", "hybrid-interleave")
    assert not fails & set(host.UNIVERSAL)
    capsys.readouterr()
    code, fails = _ascend_run(tmp_path, "0.18.0", "mtp")  # its numpy copy of 110 tokens into 104 entries raises
    assert code == 1 and "kernel-completes" in fails
    code, fails = _ascend_run(tmp_path, "0.23.0.post1", "mtp")
    assert not fails & set(host.UNIVERSAL) and fails <= TAIL

def test_vllm_adapter_refuses_a_batch_past_max_num_batched_tokens():
    """vLLM's buffers hold max_num_batched_tokens; a larger batch (cpsim's mtp preset, drafts beyond
    the budget) would be written past them, so it is not expressible, not run."""
    from cpsim.stack import vllm
    from cpsim.stack.exchange import Unsupported
    meta, _ = host.plain_input(preset("mtp"), ["v1", "v2"])
    assert meta["num_tokens"] > meta["limits"]["max_num_batched_tokens"]
    for path in ("v1", "v2"):
        with pytest.raises(Unsupported, match="max_num_batched_tokens"):
            vllm.check_supported(meta, path)
    meta["limits"]["max_num_batched_tokens"] = meta["num_tokens_padded"]
    vllm.check_supported(meta, "v1")
    vllm.check_supported(meta, "v2")


@pytest.mark.parametrize("release, v2_ok", [("0.28.0", False), ("0.31.0", True), ("0.33.0", True), ("0.34.0", True)])
def test_dummy_rows_with_tokens_reach_mrv2_hosts_whose_kernel_skips_them(release, v2_ok):
    """A dummy request with tokens goes to an MRV2 host as idx_mapping -1, not as padding flags: handed on
    where the release's kernel skips such a row (is_real_req, 0.31 on), refused before (its kernel would read
    the row) and on v1 (no dummy rows); ascend's hosts refuse it. Padded drafts are still flags (refused)."""
    from cpsim.stack import conformance, vllm, vllm_ascend
    from cpsim.stack.exchange import Unsupported
    s = conformance.dummy_rows()
    s = s.__class__(**{**s.__dict__, "groups": s.groups[:1]})  # one sharded group: every release builds it
    meta, arrays = host.plain_input(s, ["v1", "v2"])
    meta["release_version"] = release
    assert meta["dummy_tokens"] and not meta["has_padding_flags"] and (arrays["rows"] == -1).sum() == 2
    with pytest.raises(Unsupported, match="idx_mapping"):
        vllm.check_supported(meta, "v1")
    if v2_ok:
        vllm.check_supported(meta, "v2")
    else:
        with pytest.raises(Unsupported, match="is_real_req"):
            vllm.check_supported(meta, "v2")
    with pytest.raises(Unsupported, match="dummy rows"):
        vllm_ascend.check_supported(dict(meta, release_version="0.23.0.post1"), "v1")
    padded, _ = host.plain_input(conformance.preset("graph-padding"), ["v2"])
    assert padded["has_padding_flags"]


def upstream_check():
    spec = importlib.util.spec_from_file_location("upstream_check", HOSTS.parent.parent / "scripts" / "upstream_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_upstream_check_fails_on_a_new_finding_or_a_broken_release_and_passes_known_ones(tmp_path):
    uc = upstream_check()
    ok = uc.row("vllm 0.33.0", "host (vllm-0.33)", "default", "v1", "pass")
    finding = uc.row("vllm 0.33.0", "host (vllm-0.33)", "default", "v2", "fail", ["capacity:*"])
    odd = uc.row("vllm 0.33.0", "host (vllm-0.33)", "mtp", "v1", "not expressible", detail="limits: too big")
    broken = uc.row("vllm 0.31.0", "host", "*", "*", "broken", detail="ImportError: no vllm")
    known = {"vllm 0.33.0": {finding["key"]: {"invariant": "capacity", "reason": "no draft reserve",
                                              "upstream_defect": False}}}
    assert uc.exit_code([ok, odd], {}) == 0
    assert uc.exit_code([ok, finding], {}) == 1                      # new
    assert uc.classify([ok, finding], {}) == ([finding], [])
    assert uc.exit_code([ok, finding, odd], known) == 0              # known
    assert uc.exit_code([finding], {"vllm 0.31.0": known["vllm 0.33.0"]}) == 1   # known for another release only
    other = uc.row("vllm 0.33.0", "host (vllm-0.33)", "default", "v2", "fail", ["capacity:*", "padding:attn"])
    assert uc.exit_code([other], known) == 1                         # a further invariant is a new finding
    two = {"vllm 0.33.0": {other["key"]: {"reason": "both", "upstream_defect": True}}}
    fewer = uc.row("vllm 0.33.0", "host (vllm-0.33)", "default", "v2", "fail", ["padding:attn"])
    assert uc.exit_code([fewer], two) == 0                           # a recorded finding that went away is no new one
    elsewhere = uc.row("vllm 0.33.0", "host (vllm-0.33)", "mtp", "v2", "fail", ["padding:attn"])
    assert uc.exit_code([elsewhere], two) == 1                       # ... but only in the cell it was recorded for
    assert "upstream defect: both" in uc.markdown([fewer], two)
    crash = {"vllm 0.33.0": {uc.row("vllm 0.33.0", "kernel", "fuzz 8", "v2", "fail",
                                    ["v2:attention:kernel-completes:any"])["key"]: {"reason": "r"}}}
    unnamed = uc.row("vllm 0.33.0", "kernel", "fuzz 8", "v2", "fail", ["v2:*:kernel-completes:any"])
    assert uc.exit_code([unnamed], crash) == 0                       # a group cpsim could not name matches any
    other_inv = uc.row("vllm 0.33.0", "kernel", "fuzz 8", "v2", "fail", ["v2:*:padding:any"])
    assert uc.exit_code([other_inv], crash) == 1                     # ... of the same invariant only
    two_sigs = {"vllm 0.33.0": {uc.row("vllm 0.33.0", "kernel", "fuzz 8", "v2", "fail",
                                       ["v2:attention:dense-local:any", "v2:attention:no-collision:any"])["key"]:
                                {"reason": "r"}}}
    combined = uc.row("vllm 0.33.0", "kernel", "fuzz 8", "v2", "fail", ["v2:attention:dense-local+no-collision:block-id>2^24"])
    assert uc.exit_code([combined], two_sigs) == 0                   # recorded invariants, met in another draw
    host_like = uc.row("vllm 0.33.0", "kernel", "fuzz 8", "v1", "fail", ["v1:attention:dense-local:any"])
    assert uc.exit_code([host_like], two_sigs) == 1                  # another path is another finding
    assert uc.exit_code([ok, broken], {"vllm 0.31.0": {broken["key"]: {}}}) == 1   # a load failure never passes
    assert uc.exit_code([], {}) == 1                                 # nothing judged is no pass
    table = uc.markdown([ok, finding, broken], known)
    assert "mismatch: no draft reserve" in table and "cannot load or judge" in table
    assert "**NEW**" in uc.markdown([finding], {})
    kept = uc.REPROS / "r.json"                                      # a kept repro: linked from the matrix's own folder
    saved = uc.row("vllm 0.33.0", "host", "default", "v2", "fail", ["padding:attn"], repro=str(kept.relative_to(uc.ROOT)))
    link = re.search(r"\[r\.json\]\(([^)]+)\)", uc.markdown([saved], {}))[1]
    assert (uc.DOC.parent / link).resolve() == kept.resolve()
    elsewhere_kept = uc.row("vllm 0.33.0", "host", "default", "v2", "fail", ["padding:attn"], repro="build/upstream/r.json")
    assert "`build/upstream/r.json` (not shrunk, not kept)" in uc.markdown([elsewhere_kept], {})
    doc = tmp_path / "UPSTREAM.md"
    doc.write_text(f"head\n{uc.BEGIN}\nold\n{uc.END}\ntail\n")
    uc.write_matrix(doc, table)
    text = doc.read_text()
    assert "old" not in text and table in text and text.startswith("head") and text.endswith("tail\n")


def test_within_budget_raises_the_token_budget_only_when_the_batch_needs_it():
    uc = upstream_check()
    s = preset("mtp")
    fitted = uc.within_budget(s)
    assert fitted.limits.max_num_batched_tokens == max(s.batch.num_tokens, s.batch.num_tokens_padded)
    assert fitted.batch == s.batch and fitted.name != s.name
    d = preset("default")
    assert max(d.batch.num_tokens, d.batch.num_tokens_padded) <= d.limits.max_num_batched_tokens
    assert uc.within_budget(d) is d


def test_ascend_host_rows_pair_releases_cpsim_drives_and_a_bad_source_is_a_broken_row(tmp_path):
    uc = upstream_check()
    from cpsim import releases
    for version, vllm_version, paths in uc.ASCEND_HOSTS:
        rel = releases.release("vllm-ascend", version)
        assert vllm_version == rel.built_for                        # each beside the vLLM it was built for
        assert ("v2" in paths) == (rel.rules["v2"] is not None)
    named = [(n, preset(n)) for n in uc.ASCEND_HOST_PRESETS[:1]]
    (got,) = uc.check_hosts("vllm-ascend 9.9", "vllm-ascend", sys.executable, named, ("v1",),
                            str(tmp_path / "no-such-sdist"))
    assert got["verdict"] == "broken" and "--stack-source" in got["detail"]
    assert uc.exit_code([got], {}) == 1

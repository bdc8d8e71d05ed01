"""``--sizing SPEC`` on every command that judges: sweep, fuzz, replay, bugs reproduce, draw and the
pytest plugin's ``check_kernel``. The buggy twins of tests/sizing (vllm-ascend #9724, #14024) fail
naming block-sizing / capacity, the correct one passes, a repro records and replays the sizing it was
found with, and a sizing function that raises, hangs or exits is a failure (exit 1), never a pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpsim import cli
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

HERE = Path(__file__).parent / "sizing"
ROOT = Path(__file__).resolve().parents[1]
GOOD = f"{HERE}/ascend_shape.py:sizing"
MAMBA = f"{HERE}/mamba_width_div_cp.py:sizing"
NO_RESERVE = f"{HERE}/no_draft_reserve.py:sizing"
HOSTILE = {"raises": f"{HERE}/raising.py:sizing", "hangs": f"{HERE}/hanging.py:sizing",
           "exits": f"{HERE}/exits.py:sizing", "patches cpsim": f"{HERE}/hostile.py:sizing"}
BOUND = ["--sizing-timeout", "3"]  # hanging.py sleeps forever: 3 s per answer (its import is quick)


def _failed(verdicts) -> set[str]:
    return {v["invariant"] for v in verdicts if v["status"] == "fail"}


# ---- sweep -------------------------------------------------------------------------------------

def _sweep(tmp_path, spec: str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "sweep.json"
    rc = cli.main(["sweep", "--presets", "hybrid-mamba,mtp", "--paths", "v1-torch", "--sizing", spec, "--quiet",
                   "--json", str(out), *extra], runner=RUNNER)
    return rc, json.loads(out.read_text()) if out.exists() else {}


@pytest.mark.parametrize("spec, cell, invariant", [(MAMBA, "hybrid-mamba", "block-sizing"),
                                                    (NO_RESERVE, "mtp", "capacity")])
def test_sweep_fails_the_cell_a_buggy_twin_sizes_wrong(tmp_path, spec, cell, invariant):
    rc, rep = _sweep(tmp_path, spec)
    assert rc == 1 and rep["sizing"] == spec
    failed = {g["label"]: _failed(g["verdicts"]) for g in rep["groups"]}
    # A short buffer drops the batch's last tokens too (their owners then fail): capacity names the cause.
    assert invariant in failed[cell] and len(failed) == 2 and not any(v for k, v in failed.items() if k != cell)


def test_sweep_passes_the_correct_sizing(tmp_path):
    rc, rep = _sweep(tmp_path, GOOD)
    assert rc == 0 and all(not _failed(g["verdicts"]) for g in rep["groups"])


@pytest.mark.parametrize("how", ["raises", "hangs", "exits"])
def test_sweep_with_a_failing_sizing_function_is_exit_1_naming_the_cell(tmp_path, capsys, how):
    rc, rep = _sweep(tmp_path, HOSTILE[how], *(BOUND if how == "hangs" else []))
    out = capsys.readouterr().out
    assert rc == 1 and rep == {}
    assert "FAIL (--sizing): cell hybrid-mamba: sizing function" in out and Path(HOSTILE[how].split(":")[0]).name in out


def test_sweep_with_a_module_patching_cpsim_still_fails(tmp_path):
    """hostile.py patches block_sizing, capacity and passed at import: in the sizing child only."""
    rc, rep = _sweep(tmp_path, HOSTILE["patches cpsim"])
    assert rc == 1
    failed = {g["label"]: _failed(g["verdicts"]) for g in rep["groups"]}
    assert "block-sizing" in failed["hybrid-mamba"] and "capacity" in failed["mtp"]


# ---- fuzz, its repro, replay and draw ------------------------------------------------------------

def _fuzz(tmp_path, spec: str, seed: int, examples: int, *extra: str) -> tuple[int, dict, list[Path]]:
    out = tmp_path / f"fuzz-{seed}"
    rc = cli.main(["fuzz", "--paths", "v1-torch", "--sizing", spec, "--seed", str(seed), "--max-examples",
                   str(examples), "--no-db", "--quiet", "--out", str(out), "--shrink-seconds", "5", *extra], runner=RUNNER)
    summary = out / "fuzz-summary.json"
    return rc, json.loads(summary.read_text()) if summary.exists() else {}, sorted(out.glob("repro-*.json"))


# The default space draws both triggers within the first 55 scenarios for these seeds (mamba at CP > 1
# with max_model_len past a few blocks; 4+ speculative tokens at PCP 1; no_draft_reserve seed 1 is the
# last, at 51): 60 examples bound the test.
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("spec, signature", [(MAMBA, "v1-torch:mamba:block-sizing:any"),
                                             (NO_RESERVE, "v1-torch:*:capacity:any")])
def test_fuzz_finds_the_buggy_twin_in_the_default_space(tmp_path, spec, signature, seed):
    rc, summary, repros = _fuzz(tmp_path, spec, seed, 60, "--stop-after-first")
    assert rc == 1 and summary["sizing"] == spec
    found = [x["signature"] for x in summary["signatures"]]
    assert found == [signature]
    (repro,) = repros
    assert json.loads(repro.read_text())["sizing"] == spec


def test_fuzz_passes_the_correct_sizing(tmp_path):
    rc, summary, repros = _fuzz(tmp_path, GOOD, 0, 60)
    assert rc == 0 and summary["signatures"] == [] and repros == [] and summary["examples"] == 60


def test_fuzz_asks_one_child_for_every_scenario_never_its_own_process(tmp_path, monkeypatch):
    import os
    log = tmp_path / "calls.txt"
    monkeypatch.setenv("CPSIM_TEST_SIZING_LOG", str(log))
    rc, summary, _ = _fuzz(tmp_path, f"{HERE}/pid_logging.py:sizing", 0, 30)
    pids = log.read_text().split()
    assert rc == 0 and summary["examples"] == 30
    assert len(set(pids)) == 1 and pids[0] != str(os.getpid())  # one child, not this process
    # v1-torch is one host: at most one call per scenario (a host input seen before is answered from
    # the memo, so fewer), and many calls to that one child.
    assert 10 < len(pids) <= 30


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_bad_sizing_timeout_is_exit_2_naming_it(tmp_path, capsys, value):
    assert cli.main(["fuzz", "--sizing", GOOD, "--sizing-timeout", value, "--max-examples", "1", "--no-db",
                     "--out", str(tmp_path)], runner=RUNNER) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--sizing-timeout" in err[0] and "> 0" in err[0]


@pytest.mark.parametrize("how", ["raises", "hangs", "exits", "patches cpsim"])
def test_fuzz_with_a_hostile_sizing_function_fails(tmp_path, how):
    bound = BOUND if how == "hangs" else []
    rc, summary, repros = _fuzz(tmp_path, HOSTILE[how], 0, 8, "--stop-after-first", "--shrink-seconds", "3", *bound)
    assert rc == 1 and summary["signatures"] and repros
    sigs = {x["signature"] for x in summary["signatures"]}
    if how == "patches cpsim":  # it answers the two bugs: judged here, where its patches do not reach
        assert any("block-sizing" in x or "capacity" in x for x in sigs), sigs
    else:
        assert sigs == {"*:*:error-SizingFailure:any"}


def test_fuzz_with_a_sizing_module_that_cannot_load_is_exit_2(tmp_path, capsys):
    assert cli.main(["fuzz", "--sizing", f"{HERE}/raising.py:absent", "--max-examples", "1", "--no-db",
                     "--out", str(tmp_path)], runner=RUNNER) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--sizing" in err[0] and "has no attribute 'absent'" in err[0]


@pytest.fixture(scope="module")
def mamba_repro(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("repro")
    rc, _, (repro,) = _fuzz(tmp, MAMBA, 0, 60, "--stop-after-first")
    assert rc == 1
    return repro


def test_replay_uses_the_recorded_sizing_unless_the_flag_replaces_it(mamba_repro, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["replay", str(mamba_repro), "--quiet", "--json", str(out)], runner=RUNNER) == 1
    rep = json.loads(out.read_text())
    assert rep["sizing"] == MAMBA and _failed(rep["verdicts"]) == {"block-sizing"}
    assert cli.main(["replay", str(mamba_repro), "--quiet", "--sizing", GOOD], runner=RUNNER) == 0
    assert cli.main(["replay", str(mamba_repro), "--quiet", "--sizing", "cpsim"], runner=RUNNER) == 0
    assert "violation no longer shows" in capsys.readouterr().out


def test_replay_with_a_failing_sizing_function_is_exit_1(mamba_repro, capsys):
    assert cli.main(["replay", str(mamba_repro), "--sizing", HOSTILE["exits"]], runner=RUNNER) == 1
    assert "SizingFailure" in capsys.readouterr().out


def _drawable(repro: Path, tmp_path: Path) -> Path:
    """The repro with every block of more than 512 slots made 16 (a picture's limit; the fuzz's shrink is
    time-bound and may leave 4096), its cache grown to hold as many tokens. The mamba width bug still shows: cdiv(L, B x DCP) < cdiv(L, B)
    whenever L > B, and the found scenario had L > its larger B."""
    data = json.loads(repro.read_text())
    for g in data["scenario"]["groups"]:
        if g["block_size"] > 512:
            g["num_blocks"] = min(g["num_blocks"] * (g["block_size"] // 16), 2**31 - 1)  # the same tokens held
            g["block_size"] = 16
            g["kernel_block_size"] = 0 if g["kind"] == "mamba" else 16
    out = tmp_path / repro.name
    out.write_text(json.dumps(data))
    return out


def test_draw_uses_the_recorded_sizing_unless_the_flag_replaces_it(mamba_repro, tmp_path):
    repro = _drawable(mamba_repro, tmp_path)
    assert cli.main(["draw", "--repro", str(repro), "--out", str(tmp_path / "a.png"), "--quiet"], runner=RUNNER) == 1
    assert cli.main(["draw", "--repro", str(repro), "--out", str(tmp_path / "b.png"), "--quiet",
                     "--sizing", GOOD], runner=RUNNER) == 0


def _moved(repro: Path, tmp_path: Path) -> Path:
    data = json.loads(repro.read_text())
    data["sizing"] = str(tmp_path / "gone.py:sizing")
    moved = tmp_path / repro.name
    moved.write_text(json.dumps(data))
    return moved


@pytest.mark.parametrize("argv", [["replay", "{}"], ["draw", "--repro", "{}", "--out", "x.png"]])
def test_a_repro_whose_sizing_file_is_gone_is_exit_2_naming_the_field(mamba_repro, tmp_path, capsys, argv):
    moved = _moved(mamba_repro, tmp_path)
    assert cli.main([a.format(moved) for a in argv], runner=RUNNER) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "repro.sizing" in err[0] and "does not exist" in err[0] and "Traceback" not in err[0]


def test_draw_with_a_scenario_and_sizing(tmp_path, capsys):
    assert cli.main(["draw", "--scenario", "hybrid-mamba", "--paths", "v1-torch", "--sizing", MAMBA,
                     "--out", str(tmp_path / "a.svg"), "--quiet"], runner=RUNNER) == 1
    assert cli.main(["draw", "--scenario", "hybrid-mamba", "--paths", "v1-torch", "--sizing", HOSTILE["raises"],
                     "--out", str(tmp_path / "b.svg")], runner=RUNNER) == 1
    assert "FAIL (--sizing)" in capsys.readouterr().out and not (tmp_path / "b.svg").exists()


# ---- bugs reproduce ------------------------------------------------------------------------------

@pytest.mark.parametrize("fault, spec, invariant", [("mamba-sized-per-cp", MAMBA, "block-sizing"),
                                                    ("mtp-draft-capacity", NO_RESERVE, "capacity")])
def test_bugs_reproduce_fixed_form_with_the_buggy_twin_fails(tmp_path, fault, spec, invariant):
    out = tmp_path / "b.json"
    assert cli.main(["bugs", "reproduce", fault, "--fixed", "--paths", "v1-torch", "--sizing", spec,
                     "--json", str(out)], runner=RUNNER) == 1
    rep = json.loads(out.read_text())
    assert _failed(rep["verdicts"]) == {invariant} and rep["knobs"]["host_sizing"][0]["source"] == spec
    assert cli.main(["bugs", "reproduce", fault, "--fixed", "--paths", "v1-torch", "--sizing", GOOD], runner=RUNNER) == 0


def test_bugs_reproduce_with_a_failing_sizing_function_is_exit_1(capsys):
    assert cli.main(["bugs", "reproduce", "mtp-draft-capacity", "--fixed", "--paths", "v1-torch",
                     "--sizing", HOSTILE["hangs"], *BOUND], runner=RUNNER) == 1
    assert "ran past 3 s" in capsys.readouterr().out


# ---- the pytest plugin's API ----------------------------------------------------------------------

def test_check_kernel_takes_a_sizing_spec():
    from cpsim.plugin.testing import check_kernel
    kernel = f"{ROOT}/tests/kernels/callable_abi.py:slot_mapping"
    assert check_kernel(kernel, scenarios=["hybrid-mamba"], sizing=GOOD, runner=RUNNER)
    with pytest.raises(AssertionError, match="block-sizing"):
        check_kernel(kernel, scenarios=["hybrid-mamba"], sizing=MAMBA, runner=RUNNER)
    with pytest.raises(AssertionError, match="host sizing on scenario .*raised RuntimeError"):
        check_kernel(kernel, scenarios=["hybrid-mamba"], sizing=HOSTILE["raises"], runner=RUNNER)


# ---- torchrun ----------------------------------------------------------------------------------------

@pytest.mark.dist
@pytest.mark.e2e
def test_sweep_under_torchrun_sizes_every_rank(tmp_path):
    """Each rank asks its own sizing child; rank 0's report fails the cell on block-sizing (exit 1)."""
    import subprocess
    import sys
    out = tmp_path / "sweep.json"
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PY=sys.executable, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               TORCHRUN_ARGS=f"--log-dir {tmp_path / 'logs'}")
    proc = subprocess.run([str(ROOT / "launch" / "cpu-sim.sh"), "2", "sweep", "--presets", "hybrid-mamba", "--cp",
                           "2", "--paths", "v1-torch", "--sizing", MAMBA, "--quiet", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert rep["mode"] == "sweep-torchrun" and rep["sizing"] == MAMBA
    assert {g["label"]: _failed(g["verdicts"]) for g in rep["groups"]} == {"hybrid-mamba cp2": {"block-sizing"}}


def test_a_tail_group_keeps_its_row_width_under_a_plugged_in_sizing(tmp_path):
    """No release's sizing knows a tail group (cpsim's model of the unreleased KpoolTailSpec), so its table
    keeps the row's width: the correct sizing on the tail-group preset passes. (Before, the sizing's
    full-length width left entries past the row that the kernel read: a false dense-local alarm, the
    first thing fuzz found for the draft-reserve twin's seed 1.)"""
    out = tmp_path / "r.json"
    rc = cli.main(["run", "--scenario", "tail-group", "--paths", "v1,v1-torch", "--sizing", GOOD, "--quiet",
                   "--json", str(out)], runner=RUNNER)
    rep = json.loads(out.read_text())
    assert rc == 0, _failed(rep["verdicts"])
    assert any(v["invariant"] == "dense-local" and v["status"] == "pass" for v in rep["verdicts"])

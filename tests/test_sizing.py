"""``--sizing SPEC``: host sizing functions of our own in the released constructors' arithmetic,
judged by ``block-sizing`` and ``capacity``; malformed SPECs are exit 2, failing functions exit 1,
and a hostile module that patches cpsim at import cannot pass (it runs in a child process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpsim import cli, sizing
from cpsim.presets import preset
from cpsim.run import host_sizer as run_sizing
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

HERE = Path(__file__).parent / "sizing"


def _spec(name: str) -> str:
    return f"{HERE / name.split(':')[0]}:{name.split(':')[1]}"


def _run(tmp_path, preset: str, spec: str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / f"{preset}.json"
    rc = cli.main(["run", "--scenario", preset, "--paths", "v1-torch", "--sizing", spec, "--quiet",
                   "--json", str(out), *extra], runner=RUNNER)
    return rc, json.loads(out.read_text()) if out.exists() else {}


def _status(report: dict, invariant: str) -> set[str]:
    return {v["status"] for v in report["verdicts"] if v["invariant"] == invariant}


@pytest.mark.parametrize("preset", ["default", "hybrid-mamba", "mtp"])
def test_ascend_shaped_sizing_passes_on_the_presets(tmp_path, preset):
    rc, rep = _run(tmp_path, preset, _spec("ascend_shape.py:sizing"))
    assert rc == 0 and rep["passed"]
    assert _status(rep, "block-sizing") == {"pass"} and _status(rep, "capacity") == {"pass"}
    (hs,) = rep["host_sizing"]
    assert hs["host"] == "v1" and hs["source"].endswith("ascend_shape.py:sizing")


def test_mamba_width_divided_by_cp_fails_block_sizing(tmp_path, capsys):
    """vllm-ascend #9724: hybrid-mamba (DCP 4, mamba B 256, max_model_len 16384) needs 64 entries; 16 given."""
    rc, rep = _run(tmp_path, "hybrid-mamba", _spec("mamba_width_div_cp.py:sizing"))
    assert rc == 1
    bad = [v for v in rep["verdicts"] if v["invariant"] == "block-sizing" and v["status"] == "fail"]
    assert bad and {x["group"] for v in bad for x in v["violations"]} == {"mamba"}
    assert any("table width 16 < 64" in x["message"] for v in bad for x in v["violations"])
    assert _status(rep, "capacity") == {"pass"}


def test_no_draft_reserve_fails_capacity_on_mtp(tmp_path):
    """vllm-ascend #14024: mtp (5 drafts, 12 requests, 80 batched) needs 128 entries; 80 + 2 x 12 = 104 given."""
    rc, rep = _run(tmp_path, "mtp", _spec("no_draft_reserve.py:sizing"))
    assert rc == 1
    (v,) = [v for v in rep["verdicts"] if v["invariant"] == "capacity"]
    assert v["status"] == "fail" and "holds 104 entries; needs 128" in v["violations"][0]["message"]
    assert _status(rep, "block-sizing") == {"pass"}


def test_capacity_counts_the_drafts_once(tmp_path):
    """mtp schedules 44 + 11 x 6 = 110 tokens, the drafts inside each spec request's 6: the batch writes 110,
    not 110 + 4 x 12 (the drafts again); the host's need is 80 batched + 4 draft x 12 requests = 128."""
    rc, rep = _run(tmp_path, "mtp", _spec("no_draft_reserve.py:sizing"))
    (v,) = [v for v in rep["verdicts"] if v["invariant"] == "capacity"]
    assert v["violations"][0]["message"] == ("slot buffer holds 104 entries; needs 128 = 80 batched + 4 draft x 12 "
                                             "requests (this batch writes 110)")


def test_no_draft_reserve_passes_where_there_are_no_drafts(tmp_path):
    """The twin differs only in the reserve: hybrid-mamba has no speculative tokens, so it passes there."""
    rc, rep = _run(tmp_path, "hybrid-mamba", _spec("no_draft_reserve.py:sizing"))
    assert rc == 0 and rep["passed"]


def test_hostile_module_patching_cpsim_cannot_pass(tmp_path):
    """It patches block_sizing, capacity, passed and read_answer at import: in its own process only."""
    rc, rep = _run(tmp_path, "mtp", _spec("hostile.py:sizing"))
    assert rc == 1 and not rep["passed"]
    assert _status(rep, "capacity") == {"fail"}
    rc, rep = _run(tmp_path, "hybrid-mamba", _spec("hostile.py:sizing"))
    assert rc == 1 and _status(rep, "block-sizing") == {"fail"}


@pytest.mark.parametrize("preset", ["default", "hybrid-mamba"])
def test_written_out_vllm_shape_passes_under_its_profile(tmp_path, preset):
    """128-token-aligned widths and a max_num_batched_tokens buffer: vLLM 0.33.0's contract."""
    rc, rep = _run(tmp_path, preset, _spec("written_out.py:sizing"), "--profile", "vllm-0.33")
    assert rc == 0 and rep["passed"]


def test_vllm_shape_buffer_without_reserve_fails_capacity_under_cpsim(tmp_path):
    """The same function judged by cpsim's contract (drafts beyond max_num_batched_tokens) fails capacity."""
    rc, rep = _run(tmp_path, "default", _spec("written_out.py:sizing"), "--profile", "cpsim")
    assert rc == 1 and _status(rep, "capacity") == {"fail"}


@pytest.mark.parametrize("spec", ["garbage.py:wrong_keys", "garbage.py:short_list", "garbage.py:huge",
                                  "garbage.py:floats", "garbage.py:not_json", "raising.py:sizing",
                                  "exits.py:sizing"])
def test_failing_sizing_function_is_exit_1_naming_it(tmp_path, capsys, spec):
    rc, rep = _run(tmp_path, "mtp", _spec(spec))
    out = capsys.readouterr().out
    assert rc == 1 and rep == {}
    assert "FAIL (--sizing)" in out and spec.split(":")[0] in out


def test_hanging_sizing_function_is_killed_and_named():
    s = preset("mtp")
    with pytest.raises(run_sizing.SizingFailure, match="ran past 2 s"):
        run_sizing.resolve(_spec("hanging.py:sizing"), s, ["v1"], timeout=2)


@pytest.mark.parametrize("spec, rule", [
    ("no-colon", "is not a built-in"), ("vllm-9.9", "is not a built-in"), ("file.py:", "is not a built-in"),
    ("tests/sizing/missing.py:sizing", "does not exist"), ("no_such_module_xyz:fn", "no module named"),
    (f"{HERE / 'raising.py'}:absent", "has no attribute"), ("bad name:fn", "is not a module name")])
def test_malformed_spec_is_exit_2_naming_sizing(capsys, spec, rule):
    assert cli.main(["run", "--scenario", "mtp", "--paths", "v1-torch", "--sizing", spec, "--quiet"], runner=RUNNER) == 2
    err = capsys.readouterr().err
    assert "--sizing" in err and rule in err and "Traceback" not in err


def test_builtin_release_sizing_picks_its_profile_and_reads_the_release_arithmetic():
    """Numbers read off the releases' constructors (cpsim.sizing docstrings name the files)."""
    h = sizing.host_input(preset("hybrid-mamba"), "v1")   # DCP 4, mml 16384, no drafts
    assert sizing.vllm_0_33(h) == {"table_widths": [16, 2, 256, 64], "slot_buffer_len": 4096}
    assert sizing.vllm_ascend_0_23(h) == {"table_widths": [16, 64, 64, 64], "slot_buffer_len": 4096 + 2 * 8}
    m = sizing.host_input(preset("mtp"), "v1")            # 5 drafts, 12 requests, 80 batched
    assert sizing.vllm_ascend_0_23(m)["slot_buffer_len"] == 80 + 2 * 12 + 4 * 12
    assert sizing.ascend_0_23_buffer(m, draft_reserve=False) == 80 + 2 * 12
    assert sizing.vllm_0_33(m)["slot_buffer_len"] == 80


def test_cpsim_builtin_is_what_the_paths_allocate_without_sizing():
    """cpsim's own widths, worked by hand: sharded cdiv(mml, B x g); v1 unsharded cdiv(mml, B x N) x N."""
    from cpsim.paths import Knobs, v1, v2
    want = {"hybrid-mamba": [16, 256, 256, 64], "partial-replica": [4, 16, 256, 32], "prefix-replay": [8, 32, 32, 256]}
    for name, widths in want.items():
        s = preset(name)
        for host, width in (("v1", v1.physical_width), ("v2", v2.table_width)):
            assert sizing.cpsim_sizing(sizing.host_input(s, host))["table_widths"] == widths
            assert [width(s, g, Knobs()) for g in s.groups] == widths
        assert sizing.cpsim_sizing(sizing.host_input(s, "v1"))["slot_buffer_len"] == s.limits.slot_buffer_size


def test_a_sizing_answer_is_what_the_path_allocates():
    """The plugged-in widths and buffer replace cpsim's in both hosts' tables (not only in the report)."""
    from cpsim.paths import Knobs, v1, v2
    s = preset("hybrid-mamba")
    kn = Knobs(host_sizing=(sizing.HostSizing("v1", (1, 2, 3, 4), 99), sizing.HostSizing("v2", (5, 6, 7, 8), 77)))
    assert [v1.physical_width(s, g, kn) for g in s.groups] == [1, 2, 3, 4]
    assert [v2.table_width(s, g, kn) for g in s.groups] == [5, 6, 7, 8]
    assert (kn.buffer_entries(s, "v1-torch"), kn.buffer_entries(s, "v2")) == (99, 77)
    again = Knobs(**{"host_sizing": [{"host": "v1", "table_widths": [1, 2, 3, 4], "slot_buffer_len": 99}]})
    assert again.host_sizing == (sizing.HostSizing("v1", (1, 2, 3, 4), 99),)  # as a repro file reads back


def test_builtin_vllm_sizing_is_judged_by_vllm_033_and_still_must_hold_the_batch(tmp_path, capsys):
    """--sizing vllm-0.33 picks the vllm-0.33 profile (no draft reserve: 2048 entries suffice on default),
    but mtp's batch writes 110 tokens into vLLM's 80-entry buffer: capacity names both numbers."""
    rc, rep = _run(tmp_path, "default", "vllm-0.33")
    assert rc == 0 and rep["profile"] == "vllm-0.33" and rep["host_sizing"][0]["slot_buffer_len"] == 2048
    rc, rep = _run(tmp_path, "mtp", "vllm-0.33")
    (v,) = [v for v in rep["verdicts"] if v["invariant"] == "capacity"]
    assert rc == 1 and "holds 80 entries; needs 110" in v["violations"][0]["message"]

"""cpsim fuzz / replay: the search finds injected faults, shrinks them, and the repro replays."""

import dataclasses
import json
import random
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from cpsim import cli
from cpsim import fuzz as fz
from cpsim.fuzz import space
from cpsim import scenario as sc
from cpsim.errors import ConfigError
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

ROOT = Path(__file__).resolve().parents[1]

# Faults a random scenario can trigger, with the largest shrunk request count accepted.
# (Every one of them needs at most one request with tokens; a second may stay for
# capacity, where the draft slots scale with max_num_reqs.)
FAULTS = {
    "virtual-block-uses-kernel-block": 2,
    "mamba-sized-per-cp": 2,
    "cp-applied-to-unsharded-groups": 2,
    "mtp-draft-capacity": 2,
    "table-width-not-divided": 2,
    "stale-tail": 2,
    "fixed-table-window": 2,
    "fp32-block-gather": 2,
    "int32-slot-overflow": 2,
}
# The search's seed where seed 0 costs many runs to find and shrink the fault (runs counted on
# 2026-12-07, search and shrink: int32-slot-overflow 777 -> 148, fixed-table-window 562 -> 182,
# fp32-block-gather 305 -> 121); the assertions are the same for every seed.
SEEDS = {"int32-slot-overflow": 1, "fixed-table-window": 1, "fp32-block-gather": 2}
_RUNS: dict[str, fz.FuzzResult] = {}


def _fuzz(name: str, out: Path) -> fz.FuzzResult:
    if name not in _RUNS:
        # Default space for all (cpsim's kernels write int64 slots: slots past 2^31 are drawn too).
        # Shrinking bounded by Hypothesis, not by the clock (a loaded machine must not change the result).
        _RUNS[name] = fz.fuzz(fz.FuzzConfig(inject=name, max_examples=300, seed=SEEDS.get(name, 0), database=None,
                                            out=out, stop_after_first=True, shrink_seconds=3600), runner=RUNNER)
    return _RUNS[name]


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(fz.scenarios(max_programs=48))
def test_strategy_draws_valid_scenarios_that_round_trip(s):
    assert sc.validate(s) is s
    back = sc.Scenario.from_dict(json.loads(s.canonical_json()))
    assert back.fingerprint() == s.fingerprint()
    slot_groups = len(s.groups)
    assert s.cp.world * slot_groups * (s.batch.num_reqs + 1) <= max(48, s.cp.world * slot_groups * 2)
    for g in s.groups:
        assert g.num_blocks * g.bpk <= sc.INT32_MAX
        if g.circular:
            assert g.world(s.cp) == 1


@pytest.mark.parametrize("explore", fz.EXPLORERS)
def test_strategy_reaches_the_corners_the_faults_live_in(explore):
    """Large caches, positions past 4096 blocks, BPK > 1 with CP, graph padding, dummies (with tokens too): in the
    first 300 scenarios of either driver of the space (plain random draws, Hypothesis)."""
    seen = set()

    def probe(s):
        n = s.cp.world
        if any(g.num_blocks > 2**24 for g in s.groups):
            seen.add("cache > 2^24 blocks")
        if any(g.num_blocks * g.b > 2**31 for g in s.groups):
            seen.add("cache > 2^31 slots")
        if any(g.bpk > 1 and g.world(s.cp) > 1 for g in s.groups):
            seen.add("hybrid blocks under CP")
        if s.batch.num_tokens_padded > s.batch.num_tokens:
            seen.add("graph padding")
        if -1 in s.batch.idx_mapping:
            seen.add("dummy request")
        if any(r.num_tokens and s.batch.is_dummy(i) for i, r in enumerate(s.batch.requests)):
            seen.add("dummy request with tokens")
        if any(r.seq_len > 4096 * g.block_size * n for g in s.groups for r in s.batch.requests):
            seen.add("past a 4096-entry window")
        if n > 1 and n & (n - 1):
            seen.add("CP world not a power of two")
        if s.cp.pcp > 1 and s.cp.dcp > 1:
            seen.add("PCP x DCP")

    if explore == "random":
        rng = random.Random(0)
        for _ in range(300):
            probe(space.build(space.RandomDraw(rng)))
    else:  # derandomized: a fixed example sequence, so the test cannot flake on an unlucky draw
        settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                 derandomize=True)(given(fz.scenarios())(probe))()
    assert seen == {"cache > 2^24 blocks", "cache > 2^31 slots", "hybrid blocks under CP", "graph padding",
                    "dummy request", "dummy request with tokens", "past a 4096-entry window", "CP world not a power of two", "PCP x DCP"}


@pytest.mark.parametrize("space, int32_slots", [("default", False), ("default", True), ("extreme", False)])
def test_spaces_keep_their_cache_rule(space, int32_slots):
    """Default: kernel-block ids up to 2^26, ids past 2^24 reached; slots past 2^31 only in caches whose ids
    stay within 2^24 (exact in float32), and none for a kernel writing int32 slots; extreme: anything."""
    seen = set()

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    @given(fz.scenarios(space=space, int32_slots=int32_slots))
    def probe(s):
        for g in s.groups:
            ids, slots = g.num_blocks * g.bpk, g.num_blocks * g.block_size
            if space == "default":
                assert ids <= 2**26 and (slots <= 2**31 or (not int32_slots and ids <= 2**24)), g
            if ids > 2**24 + 1:
                seen.add("ids > 2^24")
            if slots > 2**31:
                seen.add("slots > 2^31")

    probe()
    assert seen == ({"ids > 2^24"} if int32_slots else {"ids > 2^24", "slots > 2^31"})


def _wide_slot_scenarios(n: int) -> list[sc.Scenario]:
    """The first ``n`` default-space draws (random explorer, seed 0) whose slots reach past 2^31, and
    more until one is at CP 1 (v1-fused runs there only)."""
    rng, out = random.Random(0), []
    while len(out) < n or all(s.cp.world > 1 for s in out):
        s = space.build(space.RandomDraw(rng))
        if any(g.slot_mapped and g.num_blocks * g.block_size > 2**31 + 2**28 for g in s.groups):
            out.append(s)
    return out


@pytest.mark.parametrize("design", ["per-request", "tile"])
def test_builtin_kernels_form_slots_past_2_31_in_int64(design):
    """cpsim's own kernels, every path, on default-space caches with slots past 2^31: no violation; the same
    kernels with their int32 product switched on (int32-slot-overflow) fail there."""
    from cpsim import kernels
    from cpsim.paths import PATHS, Knobs
    wide = _wide_slot_scenarios(8)  # the runtime-inputs space's first wrap of an int32 product is its 6th such draw
    judged = set()
    for s in wide:
        out = fz.evaluate(s, list(PATHS), Knobs(kernel_design=design), runner=RUNNER)
        assert not out.failed, (s.to_dict(), out.summary())
        judged |= {v.path for v in out.verdicts if v.status == "pass"}
    assert set(PATHS) <= judged, judged
    broken = Knobs(kernel_fault=kernels.FAULT_INT32_SLOT, kernel_design=design)
    assert any(fz.evaluate(s, ["v1", "v2"], broken, runner=RUNNER).failed for s in wide)


@pytest.mark.parametrize("explore", fz.EXPLORERS)
def test_an_int32_output_kernel_keeps_the_default_space_below_2_31(explore, tmp_path, monkeypatch):
    """The rule is read from the kernels' ABIs: an int32-output one (vllm-ascend's ascend-v1) gets no slot
    past 2^31 from either explorer; a callable (int64 out) does. The scenarios are recorded, not run."""
    from cpsim.kernels.under_test import KernelUnderTest
    drawn: list[sc.Scenario] = []

    def run(me, s, meanwhile=None):
        drawn.append(s)
        if meanwhile is not None:
            meanwhile()
        return fz.Outcome([])
    monkeypatch.setattr(fz._Searcher, "run", run)
    monkeypatch.setattr(fz._Searcher, "ahead", lambda me, s: None)
    wide = {}
    for abi in ("ascend-v1", "callable"):
        drawn.clear()
        cfg = fz.FuzzConfig(paths=["v1"], kernels={"v1": KernelUnderTest("k.py:k", None, abi, ())}, max_examples=300,
                            seed=0, database=None, out=tmp_path / abi, explore=explore)
        assert fz.search(cfg, runner=RUNNER).examples >= 290
        wide[abi] = sum(any(g.num_blocks * g.block_size > 2**31 for g in s.groups) for s in drawn)
        assert ("every slot id < 2^31" in cfg.describe_space()) == (abi == "ascend-v1")
    assert wide["ascend-v1"] == 0 and wide["callable"] >= 20, wide


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAULTS))
def test_fuzz_finds_each_injected_fault_and_shrinks_it(name, tmp_path):
    r = _fuzz(name, tmp_path)
    assert r.found, f"{name}: no violation in {r.examples} examples"
    z = fz.size(r.scenario)
    assert z["requests"] <= FAULTS[name], z
    assert z["tokens"] <= 2, z
    # Since group CP sizes (divisors of the world) joined the strategy, how far the groups and the
    # world shrink varies between runs of the same seed (seen: 4 groups for fp32-block-gather, a
    # world of 11 for table-width-not-divided, 15 for mtp-draft-capacity); these bounds held in
    # every run. Deterministic shrinking of those two dimensions is open work.
    assert z["groups"] <= 4 and z["world"] <= 16, z
    assert r.repro.exists() and r.repro.name == f"repro-{r.scenario.fingerprint()}.json"
    # The repro replays, in this process, to the invariants it recorded.
    repro = fz.load_repro(r.repro)
    assert repro.inject == name
    again = fz.replay(repro, runner=RUNNER)
    assert again.failed
    assert again.invariants() == repro.violation["invariants"] == r.reported[0].summary["invariants"]


@pytest.mark.slow
def test_without_a_fault_500_examples_find_nothing(tmp_path):
    r = fz.fuzz(fz.FuzzConfig(max_examples=500, seed=1, database=None, out=tmp_path, max_programs=16), runner=RUNNER)
    assert r.examples >= 490  # Hypothesis may draw a scenario twice; it runs once
    assert not r.found, [f.to_dict() for f in r.findings]


def test_repro_replays_identically_in_a_fresh_process(tmp_path):
    r = _fuzz("stale-tail", tmp_path)
    assert r.found
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "cpsim", "replay", str(r.repro), "--json", str(tmp_path / "o.json")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recorded = json.loads(r.repro.read_text())["violation"]
    fresh = json.loads((tmp_path / "o.json").read_text())["violation"]
    assert fresh == recorded  # invariants, counts and messages, not just the names


def test_replay_of_a_fixed_scenario_passes_without_the_fault(tmp_path):
    """The same repro with the fault's knobs removed passes: the violation is the fault's. (The search the
    two tests above and below use: one search for the three, where each xdist worker runs its own.)"""
    r = _fuzz("stale-tail", tmp_path)
    data = json.loads(r.repro.read_text())
    data["knobs"] = {}
    data["inject"] = None
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps(data))
    assert cli.main(["replay", str(clean), "--quiet"], runner=RUNNER) == 0
    assert cli.main(["replay", str(r.repro), "--quiet"], runner=RUNNER) == 1


def test_fuzz_cli_bad_input_exits_2(tmp_path, capsys):
    assert cli.main(["fuzz", "--inject", "no-such-fault", "--max-examples", "1", "--no-db"], runner=RUNNER) == 2
    assert "--inject" in capsys.readouterr().err
    assert cli.main(["replay", str(tmp_path / "missing.json")], runner=RUNNER) == 2
    (tmp_path / "x.json").write_text('{"groups": []}')
    assert cli.main(["replay", str(tmp_path / "x.json")], runner=RUNNER) == 2


def test_fuzz_cli_writes_repro_and_exits_1(tmp_path, capsys):
    # No --seed: Hypothesis only uses its example database for unseeded runs.
    code = cli.main(["fuzz", "--inject", "stale-tail", "--max-examples", "300", "--quiet", "--stop-after-first",
                     "--out", str(tmp_path / "out"), "--db", str(tmp_path / "db")], runner=RUNNER)
    assert code == 1
    files = list((tmp_path / "out").glob("repro-*.json"))
    assert len(files) == 1
    assert "padding" in json.loads(files[0].read_text())["violation"]["invariants"]
    assert any((tmp_path / "db").rglob("*"))  # the example database remembers the failure
    # ... under this configuration's key only: another fault's run does not share (or erase) it.
    keys = [p.name for p in (tmp_path / "db").iterdir()]
    assert keys == [fz.FuzzConfig(inject="stale-tail").config_key()]
    assert fz.FuzzConfig(inject="fp32-block-gather").config_key() != keys[0]
    assert fz.FuzzConfig(inject="stale-tail", space="extreme").config_key() != keys[0]


# ---- every distinct bug per run (issue 15) -------------------------------------------------

TWO_BUGS = str(ROOT / "tests/kernels/two_bugs_v1.py") + ":_compute_slot_mapping_kernel"
INT32 = str(ROOT / "tests/kernels/int32_slots.py") + ":slot_mapping"


def _replays_same(repro: Path, tmp_path: Path) -> None:
    """`cpsim replay` of the repro fails again, with the invariants it recorded."""
    out = tmp_path / f"replay-{repro.stem}.json"
    assert cli.main(["replay", str(repro), "--quiet", "--json", str(out)], runner=RUNNER) == 1
    recorded = json.loads(repro.read_text())["violation"]
    assert json.loads(out.read_text())["violation"]["invariants"] == recorded["invariants"]


def test_two_independent_bugs_give_two_signatures_in_one_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # the table on one line per signature
    out = tmp_path / "out"
    code = cli.main(["fuzz", "--paths", "v1", "--kernel-v1", TWO_BUGS, "--max-examples", "200", "--seed", "0",
                     "--no-db", "--out", str(out), "--shrink-seconds", "60"], runner=RUNNER)  # shrinking ends early; 60 s is for a loaded box
    text = capsys.readouterr().out
    assert code == 1
    summary = json.loads((out / "fuzz-summary.json").read_text())
    sigs = [x["signature"] for x in summary["signatures"]]
    assert len(sigs) == 2, sigs
    assert {x["dimension"] for x in summary["signatures"]} == {"padded-tail", "block-id>2^24"}
    assert all(x["shrunk"] for x in summary["signatures"]), summary["signatures"]  # each by Hypothesis
    assert "2 distinct violation(s)" in text and "space default" in text
    rows = [ln for ln in text.splitlines() if "repro-" in ln and "│" in ln]
    assert len(rows) == 2  # the final table
    for x in summary["signatures"]:
        assert any(x["signature"] in r and x["repro"] in r for r in rows), rows
        repro = Path(x["repro"])
        assert json.loads(repro.read_text())["fuzz"]["signature"] == x["signature"]
        _replays_same(repro, tmp_path)
    # The float32 bug shrinks to one scheduled token and a cache just big enough to hold an
    # inexact id (not the space's cap), the tail bug to one group and one request.
    fp32 = next(x for x in summary["signatures"] if x["dimension"] == "block-id>2^24")
    assert fp32["size"]["tokens"] == 1 and fp32["size"]["requests"] == 1
    # --ignore (glob) and --known (a summary file) skip accepted findings.
    code = cli.main(["fuzz", "--paths", "v1", "--kernel-v1", TWO_BUGS, "--max-examples", "60", "--seed", "0",
                     "--no-db", "--quiet", "--out", str(tmp_path / "o2"), "--known", str(out / "fuzz-summary.json")], runner=RUNNER)
    assert code == 0, capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("space", ["default", "extreme"])
def test_int32_slot_bug_is_found_in_either_space(space, tmp_path):
    """The int32 twin (int64 out, int32 product) is put on slot>=2^31 and nothing else; the default space
    reaches it too, since the callable ABI writes int64 slots."""
    base = ["fuzz", "--paths", "v1", "--kernel-v1", INT32, "--max-examples", "150", "--seed", "0", "--no-db",
            "--quiet", "--shrink-seconds", "10"] + (["--extreme"] if space == "extreme" else [])
    assert cli.main(base + ["--out", str(tmp_path / "x")], runner=RUNNER) == 1
    summary = json.loads((tmp_path / "x" / "fuzz-summary.json").read_text())
    assert summary["signatures"] and all(x["dimension"] == "slot>=2^31" for x in summary["signatures"])
    assert summary["space"].startswith(space)
    for x in summary["signatures"]:
        _replays_same(Path(x["repro"]), tmp_path)
    if space == "default":  # --ignore matches signatures, whatever the space: one search shows it
        assert cli.main(base + ["--out", str(tmp_path / "i"), "--ignore", "*:slot>=2^31"], runner=RUNNER) == 0


MRV2_INT32 = str(ROOT / "tests/kernels/vllm_mrv2_033_int32_abi.py") + ":_compute_slot_mappings_kernel"
MRV2_OK = str(ROOT / "tests/kernels/vllm_mrv2_032_abi.py") + ":_compute_slot_mappings_kernel"


@pytest.mark.parametrize("seed", [2, 1])
def test_vllm_033_mrv2_int32_twin_is_found_by_the_default_fuzz_and_by_huge_cache(seed, tmp_path):
    """vLLM 0.33.0's MRV2 defect (block id x block size in int32, int64 out) in our own kernel of that ABI:
    the default fuzz puts it on slots past 2^31 (seeds 1 and 2, within 60 scenarios; the space's dummy rows
    with tokens moved seed 0's draws off it), and `cpsim run` on
    huge-cache catches it where the same kernel widening first passes."""
    out = tmp_path / "f"
    assert cli.main(["fuzz", "--paths", "v2", "--kernel-v2", MRV2_INT32, "--max-examples", "60", "--seed", str(seed),
                     "--no-db", "--quiet", "--stop-after-first", "--shrink-seconds", "5", "--out", str(out)], runner=RUNNER) == 1
    summary = json.loads((out / "fuzz-summary.json").read_text())
    assert [x["dimension"] for x in summary["signatures"]] == ["slot>=2^31"], summary["signatures"]
    run = ["run", "--scenario", "huge-cache", "--paths", "v2", "--quiet", "--kernel-v2"]
    assert cli.main(run + [MRV2_INT32], runner=RUNNER) == 1
    assert cli.main(run + [MRV2_OK], runner=RUNNER) == 0


def test_stop_after_first_writes_one_repro(tmp_path):
    code = cli.main(["fuzz", "--paths", "v1", "--kernel-v1", INT32, "--max-examples", "150", "--seed", "0",
                     "--no-db", "--quiet", "--extreme", "--stop-after-first", "--out", str(tmp_path)], runner=RUNNER)
    assert code == 1
    assert len(list(tmp_path.glob("repro-*.json"))) == 1


@pytest.mark.slow
def test_jobs_merge_their_signatures(tmp_path):
    code = cli.main(["fuzz", "--paths", "v1", "--kernel-v1", INT32, "--max-examples", "60", "--seed", "0",
                     "--no-db", "--quiet", "--extreme", "--jobs", "2", "--shrink-seconds", "0",
                     "--out", str(tmp_path)], runner=RUNNER)  # signatures merge as found; shrinking them is shown elsewhere
    assert code == 1
    summary = json.loads((tmp_path / "fuzz-summary.json").read_text())
    assert summary["jobs"] == 2 and summary["examples"] >= 60
    sigs = [x["signature"] for x in summary["signatures"]]
    assert len(sigs) == len(set(sigs)) >= 1


def test_classification_splits_one_scenario_into_its_bugs():
    """One scenario with both defects of the two-bug kernel: each failed invariant goes to its own dimension."""
    from kernel_load import load
    k = {"v1": load(TWO_BUGS, "v1")}
    from cpsim.allocator import allocate
    g = sc.KVGroup("g0", "attention", 16, num_blocks=2**25)
    s = sc.validate(sc.Scenario("t", sc.CPConfig(), (g,), sc.Limits(64, 2, 8),
                                sc.Batch((sc.Request(3, 2),), num_tokens_padded=6)))
    # A seed whose block id is odd and past 2^24: not exact in float32.
    s = next(t for t in (s.replace(seed=i) for i in range(100))
             if (lambda b: b > 2**24 and b % 2)(int(allocate(t, 0, 0).blocks[0][0])))
    me = fz._Searcher(fz.FuzzConfig(paths=["v1"], kernels=k), None, runner=RUNNER)
    out = me.run(s)
    assert out.failed
    sigs = me.classify(s, out)
    assert sigs["v1:attention:padding:padded-tail"] == "padded-tail"
    assert any(d == "block-id>2^24" for d in sigs.values()), sigs
    assert all(d in ("padded-tail", "block-id>2^24") for d in sigs.values()), sigs


BAD_FUZZ_VALUES = [
    (["--max-examples", "0"], "--max-examples"),
    (["--max-examples", "-5"], "--max-examples"),
    (["--minutes", "-1"], "--minutes"),
    (["--minutes", "nan"], "--minutes"),
    (["--jobs", "0"], "--jobs"),
    (["--seed", "-1"], "--seed"),
    (["--out", "FILE"], "--out"),
    (["--out", "FILE/sub"], "--out"),
    (["--device", "cuda"], "--device"),
    (["--known", "MISSING"], "--known"),
]


def _bad_fuzz_argv(argv: list[str], tmp_path: Path) -> list[str]:
    (tmp_path / "FILE").write_text("x")
    return ["fuzz", "--no-db", "--quiet",
            *[a.replace("FILE", str(tmp_path / "FILE")).replace("MISSING", str(tmp_path / "missing")) for a in argv]]


@pytest.mark.parametrize("argv, field", BAD_FUZZ_VALUES)
def test_fuzz_bad_values_exit_2_before_the_search(argv, field, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "1000")  # rich would wrap the one line at 80
    code = cli.main(_bad_fuzz_argv(argv, tmp_path))
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "Traceback" not in out + err and field in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()  # nothing searched, nothing written


def test_a_bad_fuzz_value_is_one_line_from_the_process_too(tmp_path):
    """``python -m cpsim`` adds nothing to that line, whatever the field (the rows above run in-process,
    a child each cost seconds): the row that does the most before it refuses, here as a process."""
    argv, field = BAD_FUZZ_VALUES[6]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "1000"}
    proc = subprocess.run([sys.executable, "-m", "cpsim", *_bad_fuzz_argv(argv, tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and field in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_repro_is_never_lost_when_out_fails_after_the_search(tmp_path):
    """--out turned into a file after the check: the repro goes to a temporary directory, reported."""
    r = _fuzz("stale-tail", tmp_path / "first")
    bad = tmp_path / "now-a-file"
    bad.write_text("x")
    cfg = fz.FuzzConfig(inject="stale-tail", out=bad)
    problems = fz.write_findings(cfg, r)
    assert len(r.reported) == 1  # --stop-after-first: one violation
    assert len(problems) == 2  # the repro (moved) and the summary (lost, reported)
    assert "written to" in problems[0]
    moved = r.reported[0].repro
    assert moved.exists() and moved.parent != bad
    assert json.loads(moved.read_text())["fingerprint"] == r.reported[0].scenario.fingerprint()


@pytest.mark.slow
def test_under_torchrun_each_rank_fuzzes_its_own_seed_stream(tmp_path):
    """RANK/WORLD_SIZE set (as torchrun does): rank 1 searches stream 1 and writes its own summary."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
           "LOCAL_WORLD_SIZE": "2"}
    proc = subprocess.run([sys.executable, "-m", "cpsim", "fuzz", "--paths", "v1", "--kernel-v1", INT32,
                           "--max-examples", "40", "--seed", "0", "--no-db", "--quiet", "--extreme",
                           "--shrink-seconds", "0", "--out", str(tmp_path)],  # which rank's findings, not their size
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rank 1:" in proc.stdout and not (tmp_path / "fuzz-summary.json").exists()
    summary = json.loads((tmp_path / "fuzz-summary-rank1.json").read_text())
    assert summary["signatures"] and all(x["job"] == 1 for x in summary["signatures"])


def test_random_draws_replay_through_hypothesis_as_the_same_scenario():
    """The random explorer hands a failing scenario to Hypothesis as its recorded choices
    (a secondary-corpus database entry); Hypothesis must rebuild exactly that scenario, or it
    would shrink something else."""
    from hypothesis import Phase
    from cpsim.fuzz import explore

    rng = random.Random(7)
    drawn = []
    for _ in range(40):
        d = space.RandomDraw(rng)
        drawn.append((space.build(d), explore.encode(d.choices)))
    for s, blob in drawn:
        got = []

        def record(x):
            got.append(x)

        settings(max_examples=1, database=explore.seed_database([blob]), phases=[Phase.reuse],
                 suppress_health_check=list(HealthCheck), deadline=None)(given(fz.scenarios())(record))()
        assert got and got[0].fingerprint() == s.fingerprint()


def test_hypothesis_explorer_still_finds_and_shrinks(tmp_path):
    """--explore hypothesis: Hypothesis draws the scenarios too (from the same space)."""
    r = fz.fuzz(fz.FuzzConfig(inject="stale-tail", max_examples=200, seed=0, database=None, out=tmp_path,
                              stop_after_first=True, shrink_seconds=3600, explore="hypothesis"), runner=RUNNER)
    assert r.found
    z = fz.size(r.scenario)
    assert z["requests"] == 1 and z["tokens"] <= 2, z
    assert fz.replay(fz.load_repro(r.repro), runner=RUNNER).failed


def test_explore_rejects_an_unknown_explorer():
    with pytest.raises(ConfigError, match="--explore"):
        fz.search(fz.FuzzConfig(explore="grid", max_examples=1, database=None), runner=RUNNER)


@pytest.mark.slow
def test_kernels_run_ahead_in_the_worker_and_the_seed_draws_the_same_scenarios(tmp_path, monkeypatch):
    """With kernel isolation (the default) the next scenario's kernels run in the worker while the
    last one is checked; in-process nothing runs ahead. Either way a seed visits the same scenarios,
    in the same order, with the same verdicts."""
    from cpsim.run.runner import Isolation

    def visited(process: bool) -> tuple[list[str], list, int]:
        seen: list[str] = []
        real_visit, real_ahead, started = fz._Searcher.visit, RUNNER.ahead, []
        monkeypatch.setattr(fz._Searcher, "visit", lambda me, s, meanwhile=None: seen.append(s.fingerprint())
                            or real_visit(me, s, meanwhile))
        monkeypatch.setattr(RUNNER, "ahead", lambda *a: started.append(real_ahead(*a)) or started[-1])
        monkeypatch.setattr(RUNNER, "config", Isolation(process=process))
        r = fz.fuzz(fz.FuzzConfig(max_examples=40, seed=5, database=None, out=tmp_path / str(process),
                                  inject="stale-tail", shrink_seconds=0), runner=RUNNER)  # the draws, not their shrinking
        monkeypatch.undo()
        return seen, [f.signature for f in r.findings], sum(started)

    worker, inproc = visited(True), visited(False)
    assert worker[0][:40] == inproc[0][:40] and worker[1] == inproc[1] and worker[1]
    assert worker[2] >= 30 and inproc[2] == 0


def _finding(me, s):
    sigs = me.visit(s)
    assert sigs, "the scenario must fail before it can be shrunk"
    return me.findings[next(iter(sigs))]


def test_cache_shrinks_to_the_smallest_when_the_failure_does_not_need_it():
    """A repro of a cache-independent bug keeps no 66,914,920-block cache: it goes to what the batch needs."""
    g = sc.KVGroup("g0", "attention", 16, num_blocks=66_914_920)
    s = sc.validate(sc.Scenario("t", sc.CPConfig(), (g,), sc.Limits(64, 2, 16),
                                sc.Batch((sc.Request(0, 5),), num_tokens_padded=8)))
    me = fz._Searcher(fz.FuzzConfig(paths=["v1-torch"], inject="stale-tail"), None, runner=RUNNER)
    f = _finding(me, s)
    fz.shrink_caches(me)
    small = f.scenario
    assert small.groups[0].num_blocks == sc.max_blocks_needed(small, small.groups[0]) + 1
    assert f.signature in me.visit(small) and me.run(small).failed


def test_cache_shrinks_toward_the_smallest_that_still_fails():
    """float32 block ids: the cache comes down from near the space's cap, stays past 2^24 (the failure's
    dimension), and one block less no longer shows the signature."""
    from cpsim.allocator import allocate
    g = sc.KVGroup("g0", "attention", 16, num_blocks=66_914_920)
    base = sc.validate(sc.Scenario("t", sc.CPConfig(), (g,), sc.Limits(64, 2, 8), sc.Batch((sc.Request(3, 1),))))
    s = next(t for t in (base.replace(seed=i) for i in range(100))
             if (lambda b: b > 2**24 and b % 2)(int(allocate(t, 0, 0).blocks[0][0])))
    me = fz._Searcher(fz.FuzzConfig(paths=["v1"], inject="fp32-block-gather"), None, runner=RUNNER)
    f = _finding(me, s)
    assert f.dimension == "block-id>2^24"
    fz.shrink_caches(me)
    n = f.scenario.groups[0].num_blocks
    assert 2**24 < n < 66_914_920 // 2, n
    assert f.signature in me.visit(f.scenario)
    one_less = f.scenario.replace(groups=(dataclasses.replace(f.scenario.groups[0], num_blocks=n - 1),))
    assert f.signature not in (me.visit(one_less) or {})


def _sigint_default() -> None:
    """In the child before exec: SIGINT back to its default (a test run started with ``nohup ... &``
    inherits it ignored, and an ignored SIGINT stays ignored in cpsim as in any program)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_fuzz_keeps_its_summary_and_the_repros_so_far(tmp_path, sig, code):
    """Ctrl-C (or SIGTERM) once the first repro is on disk: one line, exit 130 / 143, and the summary says
    it was interrupted and lists every signature found so far with a repro file that exists."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "cpsim", "fuzz", "--inject", "stale-tail", "--paths", "v1",
                             "--max-examples", "100000", "--seed", "0", "--no-db", "--out", str(out)],
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), CPSIM_KERNEL_WORKERS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_sigint_default)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("repro-*.json")):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "no repro within 240 s"
            time.sleep(0.2)
        first = {p.name for p in out.glob("repro-*.json")}
        proc.send_signal(sig)
        text, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    lines = [ln for ln in text.splitlines() if "interrupted" in ln]
    assert len(lines) == 1 and lines[0].startswith(f"interrupted: {sig.name}; stopped before the end"), text
    assert "fuzz-summary.json" in lines[0] and "repro(s) in" in lines[0], lines[0]
    summary = json.loads((out / "fuzz-summary.json").read_text())
    assert summary["interrupted"] == sig.name and summary["examples"] >= 1
    sigs = [s for s in summary["signatures"] if not s["ignored"]]
    assert sigs and all(s["signature"].startswith("v1:") for s in sigs), sigs
    repros = {Path(s["repro"]).name for s in sigs}
    assert all((out / name).is_file() for name in repros), repros
    # No first-sighting file is left beside the signatures' repros (a shrunk one replaces it).
    assert {p.name for p in out.glob("repro-*.json")} == repros, (first, repros)
    data = json.loads((out / sorted(repros)[0]).read_text())
    assert data["inject"] == "stale-tail" and data["fuzz"]["signature"] in {s["signature"] for s in sigs}


def _live_marked(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment holds ``mark``: everything cpsim started."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            env = (d / "environ").read_bytes() if d.name.isdigit() else b""
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0] if env else "Z"
        except OSError:
            continue
        if mark.encode() in env and state != "Z":
            out.append(int(d.name))
    return out


def test_an_interrupted_fuzz_with_two_jobs_keeps_every_jobs_findings_so_far(tmp_path):
    """``--jobs 2``, Ctrl-C to the whole process group (as a terminal sends it) once the first repro is on
    disk: exit 130, one line, the summary lists every signature the jobs had found, each with its repro
    file, and no job or kernel worker is left running."""
    import uuid
    out = tmp_path / "out"
    mark = f"cpsim-fuzz-jobs-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-m", "cpsim", "fuzz", "--inject", "stale-tail", "--paths", "v1",
                             "--jobs", "2", "--max-examples", "100000", "--seed", "0", "--no-db", "--out", str(out)],
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), CPSIM_KERNEL_WORKERS="1",
                                                   CPSIM_TEST_MARK=mark),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_sigint_default)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("repro-*.json")):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "no repro within 240 s"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        text, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    end = time.monotonic() + 10
    while _live_marked(mark) and time.monotonic() < end:
        time.sleep(0.1)
    left = _live_marked(mark)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"
    assert proc.returncode == 130, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    lines = [ln for ln in text.splitlines() if "interrupted" in ln]
    assert len(lines) == 1 and lines[0].startswith("interrupted: SIGINT; stopped before the end"), text
    assert "repro(s) in" in lines[0], lines[0]
    summary = json.loads((out / "fuzz-summary.json").read_text())
    assert summary["interrupted"] == "SIGINT" and summary["jobs"] == 2 and summary["examples"] >= 1
    sigs = [s for s in summary["signatures"] if not s["ignored"]]
    assert sigs and all(s["signature"].startswith("v1:") for s in sigs), sigs
    assert all(s["job"] in (0, 1) for s in sigs), sigs
    repros = {Path(s["repro"]).name for s in sigs}
    assert all((out / name).is_file() for name in repros), repros
    assert {p.name for p in out.glob("repro-*.json")} == repros
    data = json.loads((out / sorted(repros)[0]).read_text())
    assert data["inject"] == "stale-tail" and data["fuzz"]["signature"] in {s["signature"] for s in sigs}


# Loaded by every spawned process (a fuzz job is one: `--multiprocessing-fork` in its argv) through
# PYTHONPATH: the job's search raises, or its process dies, while the parent's code stays as shipped.
_JOB_BREAKER = '''
import os, sys
if "--multiprocessing-fork" in sys.argv and os.environ.get("BREAK_JOB"):
    import cpsim.fuzz.jobs as jobs  # where a job process calls its search
    def search(*a, **k):
        if os.environ["BREAK_JOB"] == "die":
            os._exit(7)
        if os.environ["BREAK_JOB"] == "raise-slow-exit":
            import atexit, time
            atexit.register(time.sleep, 3)  # the parent's SIGTERM lands while this job is leaving
        raise RuntimeError("broken on purpose in the job")
    jobs.search = search
'''


@pytest.mark.parametrize("how, cause", [("raise", "RuntimeError: broken on purpose in the job"),
                                        ("raise-slow-exit", "RuntimeError: broken on purpose in the job"),
                                        ("die", "exit code 7")])
def test_a_failed_fuzz_job_is_one_line_and_exit_3(how, cause, tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_JOB_BREAKER)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}", "COLUMNS": "1000", "BREAK_JOB": how}
    proc = subprocess.run([sys.executable, "-m", "cpsim", "fuzz", "--no-db", "--quiet", "--paths", "v1",
                           "--max-examples", "4", "--seed", "0", "--jobs", "2", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "fuzz job " in lines[0] and cause in lines[0], proc.stderr
    traces = list(out.glob("fuzz-job-*-traceback.txt"))
    if how.startswith("raise"):
        assert len(traces) == 1 and str(traces[0]) in lines[0]
        assert "broken on purpose in the job" in traces[0].read_text()
    else:
        assert traces == []


def test_fuzz_counts_the_draws_its_profile_cannot_express(tmp_path):
    """Under vLLM 0.33's profile a partial replica (and PCP sharding KV) cannot be laid out: those draws
    are left out, and the summary and the last line count them (seed 1 draws three of them)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "1000"}
    proc = subprocess.run([sys.executable, "-m", "cpsim", "fuzz", "--no-db", "--quiet", "--paths", "v1",
                           "--profile", "vllm-0.33", "--max-examples", "60", "--seed", "1", "--shrink-seconds", "0",
                           "--out", str(tmp_path)],  # counts the draws; whatever it finds needs no shrinking
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "fuzz-summary.json").read_text())
    n = summary["not_expressible"]
    assert 0 < n <= summary["examples"], summary
    assert f"{n} not expressible under profile vllm-0.33" in proc.stdout, proc.stdout

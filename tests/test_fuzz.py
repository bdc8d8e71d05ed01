"""cpsim fuzz / replay: the search finds injected faults, shrinks them, and the repro replays."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from cpsim import cli
from cpsim import fuzz as fz
from cpsim import scenario as sc

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
_RUNS: dict[str, fz.FuzzResult] = {}


def _fuzz(name: str, out: Path) -> fz.FuzzResult:
    if name not in _RUNS:
        _RUNS[name] = fz.fuzz(fz.FuzzConfig(inject=name, max_examples=300, seed=0, database=None, out=out))
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


def test_strategy_reaches_the_corners_the_faults_live_in():
    """Large caches, positions past 4096 blocks, BPK > 1 with CP, graph padding, dummies."""
    seen = set()

    # Derandomized: a fixed example sequence, so the test cannot flake on an unlucky draw.
    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    @given(fz.scenarios())
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
        if any(r.seq_len > 4096 * g.block_size * n for g in s.groups for r in s.batch.requests):
            seen.add("past a 4096-entry window")
        if n > 1 and n & (n - 1):
            seen.add("CP world not a power of two")
        if s.cp.pcp > 1 and s.cp.dcp > 1:
            seen.add("PCP x DCP")

    probe()
    assert seen == {"cache > 2^24 blocks", "cache > 2^31 slots", "hybrid blocks under CP", "graph padding",
                    "dummy request", "past a 4096-entry window", "CP world not a power of two", "PCP x DCP"}


@pytest.mark.parametrize("name", list(FAULTS))
def test_fuzz_finds_each_injected_fault_and_shrinks_it(name, tmp_path):
    r = _fuzz(name, tmp_path)
    assert r.found, f"{name}: no violation in {r.examples} examples"
    z = fz.size(r.scenario)
    # Seen with seed 0: every fault shrinks to 1 group, 1 request, 1 token, CP 1 or 2.
    assert z["requests"] <= FAULTS[name], z
    assert z["groups"] <= 2 and z["tokens"] <= 2 and z["world"] <= 2, z
    assert r.repro.exists() and r.repro.name == f"repro-{r.scenario.fingerprint()}.json"
    # The repro replays, in this process, to the invariants it recorded.
    repro = fz.load_repro(r.repro)
    assert repro.inject == name
    again = fz.replay(repro)
    assert again.failed
    assert again.invariants() == repro.violation["invariants"] == r.outcome.invariants()


def test_without_a_fault_500_examples_find_nothing(tmp_path):
    r = fz.fuzz(fz.FuzzConfig(max_examples=500, seed=1, database=None, out=tmp_path, max_programs=16))
    assert r.examples >= 500
    assert not r.found, (r.outcome.summary() if r.outcome else None, r.scenario)


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
    """The same repro with the fault's knobs removed passes: the violation is the fault's."""
    r = _fuzz("virtual-block-uses-kernel-block", tmp_path)
    data = json.loads(r.repro.read_text())
    data["knobs"] = {}
    data["inject"] = None
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps(data))
    assert cli.main(["replay", str(clean), "--quiet"]) == 0
    assert cli.main(["replay", str(r.repro), "--quiet"]) == 1


def test_fuzz_cli_bad_input_exits_2(tmp_path, capsys):
    assert cli.main(["fuzz", "--inject", "no-such-fault", "--max-examples", "1", "--no-db"]) == 2
    assert "--inject" in capsys.readouterr().err
    assert cli.main(["replay", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "x.json").write_text('{"groups": []}')
    assert cli.main(["replay", str(tmp_path / "x.json")]) == 2


def test_fuzz_cli_writes_repro_and_exits_1(tmp_path, capsys):
    # No --seed: Hypothesis only uses its example database for unseeded runs.
    code = cli.main(["fuzz", "--inject", "stale-tail", "--max-examples", "300", "--quiet",
                     "--out", str(tmp_path / "out"), "--db", str(tmp_path / "db")])
    assert code == 1
    files = list((tmp_path / "out").glob("repro-*.json"))
    assert len(files) == 1
    assert "padding" in json.loads(files[0].read_text())["violation"]["invariants"]
    assert any((tmp_path / "db").rglob("*"))  # the example database remembers the failure

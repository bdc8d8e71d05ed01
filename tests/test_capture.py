"""Capture and replay with real Triton launches (interpreter), explicit batches, shrinking.

The capture runs cpsim's own kernels on every rank of a virtual world through
cpsim.capture's kernel wrapper; a fault is compiled into one rank's kernel at
one step. Expected locations (step, rank, first bad token) follow from the
scenario: 9 + 1 + 5 = 15 scheduled tokens, padded to 20, so the first entry a
stale-tail kernel leaves unwritten is index 15.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cpsim import capture as cap
from cpsim import kernels
from cpsim.capture import batch as xb
from cpsim.capture import load, simulate
from cpsim.cli import main
from cpsim.paths import Knobs
from cpsim.scenario import Batch, CPConfig, KVGroup, Limits, Request, Scenario, validate
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
STALE_TAIL = Knobs(kernel_fault=kernels.FAULT_STALE_TAIL)


def _step(seed: int) -> Scenario:
    return validate(Scenario(
        "cap", CPConfig(dcp=2, interleave=4),
        (KVGroup("attn", "attention", 16, 8, num_blocks=64),
         KVGroup("swa", "sliding_window", 8, cp_sharded=False, num_blocks=16),
         KVGroup("mamba", "mamba", 16, cp_sharded=False, num_blocks=8)),
        Limits(max_model_len=256, max_num_reqs=4, max_num_batched_tokens=64),
        Batch((Request(3, 9), Request(40, 1), Request(0, 5)), (), 20), seed=seed))


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> Path:
    """3 steps, v1 + v2, stale-tail compiled into rank 1's kernels at step 1 only."""
    d = tmp_path_factory.mktemp("cap") / "faulty"
    simulate.run([_step(i) for i in range(3)], d, knobs=STALE_TAIL, inject_rank=1, fault_steps={1})
    return d


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cap") / "clean"
    simulate.run([_step(i) for i in range(3)], d)
    return d


def _replay(*args: str, tmp_path: Path) -> tuple[int, dict]:
    out = tmp_path / "r.json"
    rc = main(["replay", *map(str, args), "--quiet", "--json", str(out)], runner=RUNNER)
    return rc, json.loads(out.read_text()) if out.exists() else {}


# ---- capture + replay --------------------------------------------------------

def test_one_file_per_rank_with_every_launch(faulty):
    assert sorted(p.name for p in faulty.iterdir()) == ["rank0.cpcap", "rank1.cpcap"]
    c = load.open_capture(faulty)
    assert sorted(c.index) == [0, 1, 2]
    # v1: attention + sliding window (mamba is not launched), v2: one launch
    assert [len(c.index[s][r]) for s in range(3) for r in (0, 1)] == [3] * 6


def test_replay_names_step_rank_group_token_of_the_injected_fault(faulty, tmp_path):
    rc, rep = _replay(faulty, tmp_path=tmp_path)
    assert rc == 1
    first = rep["first_violation"]
    assert rep["capture"]["step"] == 1 and rep["capture"]["unit"] == "v1"
    assert (first["invariant"], first["rank"], first["group"], first["token"]) == ("padding", 1, "g0", 15)
    failed = {v["invariant"] for v in rep["verdicts"] if v["status"] == "fail"}
    # g1 is replicated on every rank, so rank 1's stale tail there also breaks replicas-agree
    assert failed == {"padding", "matches-reference", "replicas-agree"}
    assert rep["steps_checked"] == 3  # step 0 (v1, v2) clean, step 1 v1 breaks


def test_clean_capture_replays_clean(clean, tmp_path):
    rc, rep = _replay(clean, tmp_path=tmp_path)
    assert rc == 0 and rep == {"passed": True, "steps_checked": 6, "profile": "cpsim"}


def test_fault_on_the_v2_launch_only(tmp_path):
    d = tmp_path / "v2"
    simulate.run([_step(i) for i in range(3)], d, paths=("v2",), knobs=STALE_TAIL, inject_rank=0, fault_steps={2})
    rc, rep = _replay(d, tmp_path=tmp_path)
    assert rc == 1
    assert (rep["capture"]["step"], rep["capture"]["unit"]) == (2, "v2#0")
    assert (rep["first_violation"]["rank"], rep["first_violation"]["token"]) == (0, 15)


def test_rerun_through_a_fixed_kernel_passes_and_reports_the_difference(faulty, tmp_path, capsys):
    rc = main(["replay", str(faulty), "--kernel-v1", "builtin", "--kernel-v2", "builtin", "--quiet"], runner=RUNNER)
    out = capsys.readouterr().out
    assert rc == 0
    # rank 1 left 5 tail entries of each of 2 v1 groups (and of 3 v2 groups) unwritten
    assert "differ from the captured ones in 10" in out.replace("\n", " ")
    assert "in 15" in out.replace("\n", " ")


def test_shrink_writes_a_smaller_repro_that_fails_the_same_way(faulty, tmp_path):
    small = tmp_path / "small.npz"
    rc, _ = _replay(faulty, "--shrink", small, tmp_path=tmp_path)
    assert rc == 1 and small.exists()
    s = xb.load(small)
    assert s.ranks[0].num_scheduled < 15 and len(s.groups) == 1
    rc2, rep = _replay(small, tmp_path=tmp_path)
    assert rc2 == 1 and rep["first_violation"]["invariant"] == "padding"
    assert rep["first_violation"]["rank"] == 1


def test_capture_does_not_change_what_the_kernel_computes(tmp_path):
    from cpsim.allocator import allocate_rank
    from cpsim.paths import run_path
    s = _step(5)
    allocs = allocate_rank(s, 1)
    plain = run_path("v2", s, allocs, 1).slots
    with cap.capture(tmp_path / "c") as rec:
        with rec.step(0, rank=1):
            captured = run_path("v2", s, allocs, 1).slots
    assert rec.records == 1
    assert (plain == captured).all()
    # and the recorded output is what the kernel wrote
    c = load.open_capture(tmp_path / "c")
    out = c.index[0][1][0].array("slot_mappings_ptr")
    assert np.array_equal(out, plain.numpy())


def test_policy_every_steps_and_budget(tmp_path):
    steps = [_step(i) for i in range(4)]
    rec = simulate.run(steps, tmp_path / "every", paths=("v2",), every=2)
    assert sorted(load.open_capture(tmp_path / "every").index) == [0, 2]
    simulate.run(steps, tmp_path / "range", paths=("v2",), steps="1..2")
    assert sorted(load.open_capture(tmp_path / "range").index) == [1, 2]
    rec = simulate.run(steps, tmp_path / "budget", paths=("v2",), budget=20_000)
    c = load.open_capture(tmp_path / "budget")
    assert rec.records < 8 and c.truncated and rec.bytes <= 20_000
    # replay checks the complete steps before the cut and says where it stopped
    notes: list[str] = []
    done = list(load.steps(tmp_path / "budget", notes))
    cut = min(t["step"] for t in c.truncated.values())
    assert cut >= 1 and [s.label["step"] for s in done] == list(range(cut)) and f"ran out at step {cut}" in notes[0]
    assert main(["replay", str(tmp_path / "budget"), "--quiet"], runner=RUNNER) == 0


def test_capture_off_wraps_nothing():
    import cpsim.kernels.triton_v2 as tv2
    before = tv2._compute_slot_mappings_kernel
    assert cap.install({}) is None
    assert tv2._compute_slot_mappings_kernel is before and cap.active() is None
    # a sitecustomize.py with capture off loads neither numpy nor torch
    code = "import sys, cpsim.capture as c; c.install(); print('numpy' in sys.modules, 'torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPSIM_CAPTURE")} | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_env_switch_in_a_fresh_process(tmp_path):
    """CPSIM_CAPTURE + install() before the kernel module is imported (the sitecustomize recipe)."""
    code = ("import cpsim.capture as c; c.install()\n"
            "from cpsim.faults.catalogue import _stale_tail\n"
            "from cpsim.faults.detect import run\n"
            "run(_stale_tail(), paths=('v1',))\n")
    env = dict(os.environ, CPSIM_CAPTURE=str(tmp_path / "env"), CPSIM_CAPTURE_RANK="0", TRITON_INTERPRET="1",
               PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    c = load.open_capture(tmp_path / "env")
    assert list(c.index) == [0] and len(c.index[0][0]) == 1
    assert main(["replay", str(tmp_path / "env"), "--quiet"], runner=RUNNER) == 0


# ---- explicit batches ----------------------------------------------------------

def test_shuffled_positions_example_checks_clean():
    s = xb.load(EXAMPLES / "explicit-shuffled-positions.json")
    assert s.ranks[0].positions[:8].tolist() == [5, 2, 7, 0, 3, 6, 1, 4]
    assert main(["replay", str(EXAMPLES / "explicit-shuffled-positions.json"), "--quiet"], runner=RUNNER) == 0


def test_shuffled_positions_with_two_slots_swapped_fail(tmp_path):
    data = json.loads((EXAMPLES / "explicit-shuffled-positions.json").read_text())
    row = data["arrays"]["r0/slots"][0]
    row[1], row[3] = row[3], row[1]  # positions 2 and 0 trade slots on rank 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    rc, rep = _replay(bad, tmp_path=tmp_path)
    assert rc == 1
    failed = {v["invariant"] for v in rep["verdicts"] if v["status"] == "fail"}
    assert {"dense-local", "matches-reference"} <= failed
    assert rep["first_violation"]["rank"] == 0 and rep["first_violation"]["token"] in (1, 3)


def test_spec_decode_example_runs_a_kernel_on_the_inputs(tmp_path):
    rc, rep = _replay(EXAMPLES / "explicit-spec-decode-padded.json", tmp_path=tmp_path)
    assert rc == 0 and rep["steps_checked"] == 1


def test_explicit_batch_round_trips_through_npz(tmp_path):
    s = xb.load(EXAMPLES / "explicit-shuffled-positions.json")
    xb.save(s, tmp_path / "x.npz")
    t = xb.load(tmp_path / "x.npz")
    assert np.array_equal(t.ranks[1].slots, s.ranks[1].slots) and t.groups == s.groups
    assert np.load(tmp_path / "x.npz")["r1/g0/table"].tolist() == [[2, 6]]  # a plain .npz for numpy


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["ranks"].pop(), "ranks"),
    (lambda d: d["arrays"].update({"query_start_loc": [0, 9]}), "positions"),
    (lambda d: d["arrays"].update({"query_start_loc": [0, 5, 3]}), "query_start_loc"),
    (lambda d: d["arrays"].update({"r1/g0/table": [[2, 99]]}), "table"),
    (lambda d: d["arrays"].update({"idx_mapping": [1]}), "table"),
    (lambda d: d["arrays"].update({"r0/slots": [[1, 2]], "r1/slots": [[1, 2], [3, 4]]}), "slots"),
])
def test_bad_explicit_batches_exit_2(tmp_path, capsys, edit, field):
    data = json.loads((EXAMPLES / "explicit-shuffled-positions.json").read_text())
    edit(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert main(["replay", str(bad)], runner=RUNNER) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


def test_capture_with_a_missing_rank_file_exits_2(faulty, tmp_path, capsys):
    d = tmp_path / "one"
    d.mkdir()
    shutil.copy(faulty / "rank0.cpcap", d)
    assert main(["replay", str(d)], runner=RUNNER) == 2
    assert "rank(s) [1]" in capsys.readouterr().err


# ---- torchrun (gloo, one process per rank) ----------------------------------------

@pytest.mark.dist
@pytest.mark.e2e
def test_capture_under_torchrun_via_sitecustomize(tmp_path):
    """The documented recipe: sitecustomize.py calls install(); each torchrun rank writes its own file."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import cpsim.capture; cpsim.capture.install()\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PY=sys.executable, PYTHONPATH=f"{site}:{ROOT}", TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               CPSIM_CAPTURE=str(tmp_path / "cap"))
    run = subprocess.run([str(ROOT / "launch" / "cpu-sim.sh"), "2", "--dcp", "2", "--inject", "stale-tail",
                          "--inject-on-rank", "1", "--paths", "v1,v2", "--timeout", "120", "--quiet"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]  # the run itself sees the fault
    assert sorted(p.name for p in (tmp_path / "cap").iterdir()) == ["rank0.cpcap", "rank1.cpcap"]
    rc, rep = _replay(tmp_path / "cap", tmp_path=tmp_path)
    assert rc == 1
    assert rep["first_violation"]["rank"] == 1 and rep["first_violation"]["invariant"] == "padding"


def test_draw_a_captured_step(faulty, tmp_path):
    out = tmp_path / "step.png"
    assert main(["draw", "--capture", str(faulty), "--out", str(out), "--quiet"], runner=RUNNER) == 1  # the failing step
    assert out.stat().st_size > 10_000
    assert main(["draw", "--capture", str(faulty), "--step", "0", "--out", str(out), "--quiet"], runner=RUNNER) == 0


def test_a_second_owner_is_named_by_rank(tmp_path):
    """short-request-rank on rank 1: a request of 3 tokens (< I = 4) is all rank 0's, rank 1 maps one anyway."""
    s = validate(Scenario("short", CPConfig(dcp=2, interleave=4), (KVGroup("attn", "attention", 16, 8, num_blocks=64),),
                          Limits(max_model_len=256, max_num_reqs=4, max_num_batched_tokens=64),
                          Batch((Request(21, 9), Request(0, 3)), (), 0)))
    simulate.run([s], tmp_path / "c", paths=("v1",), knobs=Knobs(kernel_fault=kernels.FAULT_SHORT_REQ),
                 inject_rank=1)
    rc, rep = _replay(tmp_path / "c", tmp_path=tmp_path)
    assert rc == 1
    f = rep["first_violation"]
    assert (f["rank"], f["token"], f["request"], f["position"]) == (1, 9, 1, 0)
    assert {v["invariant"] for v in rep["verdicts"] if v["status"] == "fail"} >= {"exactly-one-owner"}


def test_env_policy_values_are_validated():
    from cpsim.capture.recorder import parse_ranks, policy_from_env
    from cpsim.errors import ConfigError
    p = policy_from_env({"CPSIM_CAPTURE_EVERY": "3", "CPSIM_CAPTURE_STEPS": "2..9", "CPSIM_CAPTURE_BUDGET": "2M",
                         "CPSIM_CAPTURE_RANKS": "0-2,5"})
    assert (p.every, p.first, p.last, p.budget, p.ranks) == (3, 2, 9, 2 << 20, (0, 1, 2, 5))
    assert p.wants(3, 5) and not p.wants(3, 4) and not p.wants(4, 0) and not p.wants(12, 0)
    assert parse_ranks("") is None
    for env in ({"CPSIM_CAPTURE_EVERY": "0"}, {"CPSIM_CAPTURE_STEPS": "5..2"}, {"CPSIM_CAPTURE_BUDGET": "lots"},
                {"CPSIM_CAPTURE_RANKS": "3-1"}):
        with pytest.raises(ConfigError, match=next(iter(env))):
            policy_from_env(env)


def test_a_recording_failure_never_breaks_the_launch(tmp_path, capsys):
    """The kernel's result stands and the process goes on; recording stops with one line on stderr."""
    from cpsim.allocator import allocate_rank
    from cpsim.paths import run_path
    s = _step(7)
    allocs = allocate_rank(s, 0)
    plain = run_path("v1", s, allocs, 0).slots
    with cap.capture(tmp_path / "c") as rec:
        rec.write = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
        with rec.step(0, rank=0):
            got = run_path("v1", s, allocs, 0).slots
    assert (got == plain).all()
    assert rec.failed == "OSError: disk full" and rec.records == 0
    assert "recording stopped at step 0 call 0 of rank 0: OSError: disk full" in capsys.readouterr().err


@pytest.mark.parametrize("path, spec", [
    ("v1", "tests/kernels/ascend_v1_abi.py:_compute_slot_mapping_kernel"),
    ("v2", "tests/kernels/ascend_v2_abi.py:_compute_slot_mappings_kernel"),
    ("v2", "tests/kernels/vllm_v2_abi.py:_compute_slot_mappings_kernel"),
])
def test_capture_of_upstream_abis_replays(tmp_path, path, spec):
    """A kernel with vllm-ascend's / vLLM's argument list, wrapped as a serving process would have it."""
    from cpsim.allocator import allocate_rank
    from cpsim.paths import run_path
    from cpsim.kernels.under_test import inspect_here, load as load_kernel
    s = validate(Scenario("abi", CPConfig(dcp=2, interleave=4),
                          (KVGroup("attn", "attention", 16, 8, num_blocks=64), KVGroup("b8", "attention", 8,
                                                                                         num_blocks=64)),
                          Limits(max_model_len=256, max_num_reqs=4, max_num_batched_tokens=64),
                          Batch((Request(3, 9), Request(40, 1), Request(0, 5)), (2, 0, 3), 20)))
    # a serving process holds its kernel itself: imported here, not in a kernel worker
    k = load_kernel(str(ROOT / spec.split(":")[0]) + ":" + spec.split(":")[1], path, inspect=inspect_here)
    with cap.capture(tmp_path / "c", kernels=()) as rec:
        k.obj = cap.wrap(k.obj, rec)
        for r in range(2):
            with rec.step(0, rank=r):
                run_path(path, s, allocate_rank(s, r), r, "cpu", Knobs(), k)
    assert rec.records >= 2
    rc, rep = _replay(tmp_path / "c", tmp_path=tmp_path)
    assert rc == 0 and rep["steps_checked"] == 1
    # the same capture with one slot changed on rank 1 is caught there
    c = load.open_capture(tmp_path / "c")
    step = next(load.steps(tmp_path / "c"))
    step.ranks[1].slots[0, 2] += 1
    xb.save(step, tmp_path / "bad.npz")
    rc, rep = _replay(tmp_path / "bad.npz", tmp_path=tmp_path)
    assert rc == 1 and rep["first_violation"]["rank"] == 1 and c.files


def test_html_report_of_a_failing_step(faulty, tmp_path):
    page = tmp_path / "r.html"
    assert main(["replay", str(faulty), "--quiet", "--html", str(page)], runner=RUNNER) == 1
    text = page.read_text()
    assert "data:image/png;base64," in text and "padding" in text


def test_auto_steps_follow_the_reuse_of_output_buffers(tmp_path):
    """Without step scopes a step ends when a kernel writes a buffer it already wrote in this step."""
    rec = cap.Recorder(tmp_path, rank=0)
    places = [rec._place(0, key) for key in (("v1", 1), ("v1", 2), ("v2", 9), ("v1", 1), ("v1", 2), ("v2", 9),
                                             ("v2", 9))]
    assert places == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0)]


# Worked out by hand (SPEC §2; DCP 2, I 2, B 4, V 8) for explicit-spec-decode-padded.json: rank 0 holds
# p=12 (row 1 entry 1 = 9, offset 2 -> 38) and p=5 (row 0 entry 0 = 5, offset 3 -> 23); rank 1 holds p=10, 11
# (row 1 entry 1 = 8, offsets 0, 1 -> 32, 33) and p=6 (row 0 entry 0 = 4, offset 2 -> 18); 13, 7, 8 are
# rejected drafts (is_padding) and get PAD; entries 8..15 are padding.
SPEC_DECODE_SLOTS = ([-1, -1, 38, -1, 23, -1, -1, -1] + [-1] * 8, [32, 33, -1, -1, -1, 18, -1, -1] + [-1] * 8)


def _with_slots(tmp_path, slots, name="given.json") -> Path:
    data = json.loads((EXAMPLES / "explicit-spec-decode-padded.json").read_text())
    data["arrays"]["r0/slots"], data["arrays"]["r1/slots"] = [list(slots[0])], [list(slots[1])]
    out = tmp_path / name
    out.write_text(json.dumps(data))
    return out


def test_rejected_drafts_flagged_is_padding_must_get_pad(tmp_path):
    rc, _ = _replay(_with_slots(tmp_path, SPEC_DECODE_SLOTS), tmp_path=tmp_path)
    assert rc == 0
    bad = [list(SPEC_DECODE_SLOTS[0]), list(SPEC_DECODE_SLOTS[1])]
    bad[1][6] = 41  # rank 1 writes a slot for the rejected draft at position 7
    rc, rep = _replay(_with_slots(tmp_path, bad, "bad.json"), tmp_path=tmp_path)
    assert rc == 1
    f = rep["first_violation"]
    assert (f["invariant"], f["rank"], f["request"], f["position"], f["token"]) == ("padding", 1, 1, 7, 6)
    wrong = [list(SPEC_DECODE_SLOTS[0]), list(SPEC_DECODE_SLOTS[1])]
    wrong[0][2] = 37  # a kept token one slot off
    rc, rep = _replay(_with_slots(tmp_path, wrong, "wrong.json"), tmp_path=tmp_path)
    assert rc == 1 and rep["first_violation"]["position"] == 12 and rep["first_violation"]["token"] == 2


def test_meta_block_sizes_judge_a_wrong_block_size_argument_against_the_real_layout(tmp_path):
    """virtual-block-uses-kernel-block hands the kernel b = 8 as KV_CACHE_BLOCK_SIZE. From the arguments alone
    replay models B = 8 (then I = 16 > B breaks owner-rule anyway); with meta block_sizes it models B = 16."""
    from cpsim import faults
    f = faults.get("virtual-block-uses-kernel-block")
    s = f.trigger()  # B = 16, b = 8, DCP 2, I = 16
    simulate.run([s], tmp_path / "plain", knobs=f.knobs_for(s))
    simulate.run([s], tmp_path / "meta", knobs=f.knobs_for(s), meta={"block_sizes": [16]})
    assert [(g.block_size, g.b) for g in next(load.steps(tmp_path / "plain")).groups] == [(8, 8)]
    assert [(g.block_size, g.b) for g in next(load.steps(tmp_path / "meta")).groups] == [(16, 8)]
    for d in ("plain", "meta"):
        rc, rep = _replay(tmp_path / d, tmp_path=tmp_path)
        failed = {v["invariant"] for v in rep["verdicts"] if v["status"] == "fail"}
        assert rc == 1 and "owner-rule" in failed, d
    simulate.run([s], tmp_path / "badmeta", meta={"block_sizes": [12]})
    assert main(["replay", str(tmp_path / "badmeta")], runner=RUNNER) == 2


def test_options_that_do_not_apply_are_refused(tmp_path, capsys):
    assert main(["replay", str(EXAMPLES / "explicit-shuffled-positions.json"), "--kernel-v1-fused", "builtin"], runner=RUNNER) == 2
    repro = next((ROOT / "examples").glob("virtual-block-uses-kernel-block.json"))
    assert main(["replay", str(repro), "--shrink", str(tmp_path / "x.npz")], runner=RUNNER) == 2
    assert "--shrink" in capsys.readouterr().err


def test_packed_host_copy_returns_every_tensor_unchanged():
    """The GPU branch (one device->host copy) run on CPU tensors: dtypes, shapes and values survive the packing."""
    import torch
    from cpsim.capture.recorder import to_host
    views = [torch.tensor([0, 5, 9], dtype=torch.int32), torch.arange(12, dtype=torch.int64).reshape(3, 4) - 6,
             torch.tensor([[2**40, -1]], dtype=torch.int64), torch.tensor([True, False]),
             torch.tensor([7, 8], dtype=torch.uint64)]
    for got, want in zip(to_host(views, packed=True), views):
        assert got.dtype == want.numpy().dtype and got.shape == tuple(want.shape)
        assert np.array_equal(got, want.numpy())


def test_a_captured_steps_picture_draws_every_violated_invariant_inside_the_canvas(faulty):
    """Issue 30: the capture picture's legend was clipped and its padding violation not drawn."""
    from matplotlib.text import Text
    from test_draw import outside_canvas

    from cpsim.capture.steps import check_step, iter_steps
    from cpsim.check import explicit
    from cpsim.report import layout_picture, figure
    out = next(o for o in map(check_step, iter_steps(str(faulty))) if o.failed)
    pic = layout_picture.build(out.scenario, out.gathered, explicit.allocations(out.step), out.verdicts)
    fig = figure.render(pic, "step 1")
    violated = {(v.path, v.invariant) for v in out.verdicts if v.status == "fail" and "~" not in v.path}
    assert ("v1", "padding") in violated or ("v2", "padding") in violated
    marked = {(p.path, m[0]) for p in pic.panels.values() for m in p.marks}
    assert violated <= marked
    assert {inv for _, inv in violated} <= {t.get_text() for t in fig.findobj(Text)}
    assert not outside_canvas(fig), outside_canvas(fig)

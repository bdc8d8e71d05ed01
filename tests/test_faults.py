"""The bug catalogue: every fault shows on its trigger, its fixed form is clean, the CLI says so."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cpsim.kernels import use_interpreter

use_interpreter()

from cpsim.check import coordinator  # noqa: E402

from cpsim import faults  # noqa: E402
from cpsim.allocator import allocate_rank  # noqa: E402
from cpsim.cli import main  # noqa: E402
from cpsim.errors import ConfigError  # noqa: E402
from cpsim.faults import detect  # noqa: E402
from cpsim.layout import PAD_SLOT_ID, POISON  # noqa: E402
from cpsim.paths import PATHS, Knobs  # noqa: E402
from cpsim.scenario import validate  # noqa: E402
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

NAMES = faults.names()
SPEC_NAMES = ("virtual-block-uses-kernel-block", "mamba-sized-per-cp", "cp-applied-to-unsharded-groups",
              "mtp-draft-capacity", "table-width-not-divided", "stale-tail", "fixed-table-window",
              "fp32-block-gather", "int32-slot-overflow", "draft-overwrite", "short-request-rank",
              "group-cp-size-ignored", "shard-rank-not-modulo", "virtual-block-uses-world-size",
              "kernel-block-size-ignored", "is-padding-ignored", "padded-count-tail",
              "replay-window-off-by-one", "replay-start-from-computed", "replay-pads-every-group")


def test_catalogue_is_spec_section_6():
    assert sorted(NAMES) == sorted(SPEC_NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_entry_is_well_formed(name):
    f = faults.get(name)
    assert f.knobs != Knobs(), "a fault must deviate from the correct runtime"
    assert f.paths and set(f.paths) <= set(PATHS)
    assert f.invariants and set(f.invariants) <= set(coordinator.INVARIANTS)
    assert f.references and len(f.explanation) > 100
    s = f.trigger()
    assert validate(s) is s


@pytest.mark.parametrize("name", NAMES)
def test_caught_on_trigger_and_fixed_form_is_clean(name):
    f = faults.get(name)
    bad = detect.reproduce(f, runner=RUNNER)
    hits = {inv: [p for p in bad.failed.get(inv, []) if p in f.paths] for inv in f.invariants}
    assert any(hits.values()), f"{name}: none of {f.invariants} caught it on {f.paths}; failed: {bad.failed}"
    good = detect.reproduce(f, fixed=True, runner=RUNNER)
    assert good.passed, f"{name}: fixed form fails {good.failed}"
    assert all(v.status in ("pass", "n/a") for v in good.verdicts)
    # Same scenario both times: the catch is the fault's doing.
    assert bad.scenario.fingerprint() == good.scenario.fingerprint()


@pytest.fixture(scope="module")
def trigger_matrix():
    return detect.matrix(presets=(), jobs=1, runner=RUNNER)


@pytest.mark.parametrize("name", NAMES)
def test_matrix_catches(trigger_matrix, name):
    (cell,) = trigger_matrix.for_fault(name)
    assert cell.applicable and not cell.baseline_failed
    assert cell.caught, f"{name} not caught on its trigger"


def test_matrix_rate_is_total(trigger_matrix):
    assert trigger_matrix.rate == (len(NAMES), len(NAMES))


def test_unknown_fault_names_the_known_ones():
    with pytest.raises(ConfigError) as e:
        faults.get("no-such-bug")
    assert "stale-tail" in str(e.value) and e.value.field == "fault"


# ---- what each fault does, from hand-worked numbers ------------------------------

def _slots(r, path, group=0):
    return r.gathered[path].slots[:, group, :]


def test_virtual_block_skews_ownership_to_rank0():
    # B=16, b=8, N=2, I=16, positions 0..31: rank 0 owns 0-15, rank 1 owns 16-31.
    # Built from b: V = 16, vo = p % 16 < I, so (vo // 16) % 2 = 0 -> rank 0 holds everything.
    r = detect.reproduce(faults.get("virtual-block-uses-kernel-block"), paths=["v1"], runner=RUNNER)
    own = {o.rank: o for o in detect.ownership(r)}
    assert own[0].expected == list(range(16)) and own[1].expected == list(range(16, 32))
    assert own[0].actual == list(range(32)) and own[1].actual == []
    assert detect.ranges(own[0].actual) == "0-31"


def test_mtp_buffer_is_the_old_formula():
    f = faults.get("mtp-draft-capacity")
    assert f.knobs.buffer_size == 80 + 2 * 12 == 104
    s = f.trigger()
    assert s.limits.slot_buffer_size == 80 + (5 - 1) * 12 == 128
    r = detect.reproduce(f, paths=["v1"], runner=RUNNER)
    (v,) = [v for v in r.verdicts if v.invariant == "capacity"]
    assert v.status == "fail" and v.count == 128 - 104
    assert "writes 72)" in v.violations[0].message  # 12 x 6 scheduled, each request's 5 drafts among its 6


def test_cp_transform_on_replicated_group_pads_half():
    # vLLM #57260's example: CP 2, replicated block-4 group, positions 0..3 on rank 0:
    # correct q*4 + {0,1,2,3}; buggy {q*4, PAD, q*4+1, PAD}.
    f = faults.get("cp-applied-to-unsharded-groups")
    s = f.trigger()
    q = int(allocate_rank(s, 0)[1].blocks[0][0])
    bad = detect.reproduce(f, paths=["v2"], runner=RUNNER)
    assert _slots(bad, "v2", 1)[0, :4].tolist() == [q * 4, PAD_SLOT_ID, q * 4 + 1, PAD_SLOT_ID]
    good = detect.reproduce(f, fixed=True, paths=["v2"], runner=RUNNER)
    assert _slots(good, "v2", 1)[0, :4].tolist() == [q * 4 + i for i in range(4)]


def test_stale_tail_leaves_entries_5_to_7_unwritten():
    f = faults.get("stale-tail")
    bad = detect.reproduce(f, runner=RUNNER)
    for path in PATHS:
        assert _slots(bad, path)[0, 5:8].tolist() == [POISON] * 3, path
        assert _slots(bad, path)[0, 8:].eq(PAD_SLOT_ID).all(), path


def test_fixed_window_reads_entry_4095():
    f = faults.get("fixed-table-window")
    s = f.trigger()
    blocks = allocate_rank(s, 0)[0].blocks[0]
    bad = detect.reproduce(f, paths=["v1"], runner=RUNNER)
    slot = int(_slots(bad, "v1")[0, 0])
    assert slot == int(blocks[4095]) * 16 + 0  # position 65536 = 4096 * 16, offset 0
    assert int(blocks[4095]) != int(blocks[4096])


def test_fp32_rounds_the_block_id():
    f = faults.get("fp32-block-gather")
    blk = int(allocate_rank(f.trigger(), 0)[0].blocks[0][0])
    rounded = int(np.float32(blk))
    assert blk > 2**24 and rounded != blk
    bad = detect.reproduce(f, paths=["v1", "v2"], runner=RUNNER)
    for path in ("v1", "v2"):
        assert int(_slots(bad, path)[0, 0]) == rounded * 16


def test_int32_slot_wraps():
    f = faults.get("int32-slot-overflow")
    blk = int(allocate_rank(f.trigger(), 0)[0].blocks[0][0])
    assert blk * 128 >= 2**31
    wrapped = (blk * 128 + 2**31) % 2**32 - 2**31
    bad = detect.reproduce(f, paths=["v1"], runner=RUNNER)
    assert int(_slots(bad, "v1")[0, 0]) == wrapped


def test_draft_overwrite_leaks_lookahead_into_tail():
    # 2 requests x 4 tokens + 2 x (3 - 1) look-ahead = 12 draft entries in a 12-entry buffer.
    f = faults.get("draft-overwrite")
    s = f.trigger()
    assert s.limits.slot_buffer_size == 12
    bad = detect.reproduce(f, paths=["v1"], runner=RUNNER)
    tail = _slots(bad, "v1")[:, 8:12]
    assert (tail != PAD_SLOT_ID).any()
    good = detect.reproduce(f, fixed=True, paths=["v1"], runner=RUNNER)
    assert _slots(good, "v1")[:, 8:].eq(PAD_SLOT_ID).all()


def test_short_request_rank1_maps_first_token_into_null_block():
    # 5 tokens < I = 16: all on rank 0; the fault makes rank 1 map token 0 through an empty row.
    bad = detect.reproduce(faults.get("short-request-rank"), paths=["v1"], runner=RUNNER)
    x = _slots(bad, "v1")
    assert x[1, :5].tolist() == [0, PAD_SLOT_ID, PAD_SLOT_ID, PAD_SLOT_ID, PAD_SLOT_ID]
    assert (x[0, :5] != PAD_SLOT_ID).all()


def test_inject_on_one_rank_only():
    # short-request-rank on rank 0 changes nothing (rank 0 owns the request); on rank 1 it shows.
    f = faults.get("short-request-rank")
    assert detect.reproduce(f, paths=["v1"], inject_rank=0, runner=RUNNER).passed
    assert not detect.reproduce(f, paths=["v1"], inject_rank=1, runner=RUNNER).passed


# ---- CLI --------------------------------------------------------------------------

def test_cli_reproduce_exit_codes(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["bugs", "reproduce", "virtual-block-uses-kernel-block", "--json", str(out)], runner=RUNNER) == 1
    text = capsys.readouterr().out
    assert "owned tokens per rank" in text and "0-31" in text and "16-31" in text
    data = json.loads(out.read_text())
    assert data["fault"] == "virtual-block-uses-kernel-block" and data["passed"] is False
    assert data["ownership"]
    assert main(["bugs", "reproduce", "virtual-block-uses-kernel-block", "--fixed"], runner=RUNNER) == 0
    assert "every invariant holds" in capsys.readouterr().out


def test_cli_unknown_name_is_bad_input(capsys):
    assert main(["bugs", "reproduce", "nope"], runner=RUNNER) == 2
    assert main(["bugs", "show", "nope"], runner=RUNNER) == 2
    assert main(["run", "--scenario", "hybrid-mamba", "--inject", "nope"], runner=RUNNER) == 2
    err = capsys.readouterr().err
    assert "unknown fault 'nope'" in err and "draft-overwrite" in err


def test_cli_list_and_show(tmp_path, capsys):
    assert main(["bugs", "list"], runner=RUNNER) == 0
    listed = capsys.readouterr().out
    assert all(n in listed for n in NAMES)
    dump = tmp_path / "s.json"
    assert main(["bugs", "show", "mtp-draft-capacity", "--dump", str(dump)], runner=RUNNER) == 0
    shown = capsys.readouterr().out
    assert "vllm-ascend #14024" in shown and "capacity" in shown and "slot buffer 128" in shown
    # The dumped trigger plus --inject reproduces through `cpsim run`.
    assert main(["run", "--scenario", str(dump), "--paths", "v1", "--quiet", "--inject", "mtp-draft-capacity"], runner=RUNNER) == 1
    assert main(["run", "--scenario", str(dump), "--paths", "v1", "--quiet"], runner=RUNNER) == 0


def test_cli_inject_on_rank_bounds(capsys):
    assert main(["run", "--scenario", "hybrid-mamba", "--inject", "stale-tail", "--inject-on-rank", "4"], runner=RUNNER) == 2
    assert main(["run", "--scenario", "hybrid-mamba", "--inject-on-rank", "0"], runner=RUNNER) == 2
    assert "--inject-on-rank" in capsys.readouterr().err


def test_cli_matrix_prints_rate_last(capsys):
    assert main(["bugs", "matrix", "--presets", "none", "--faults", "stale-tail,short-request-rank",
                 "--jobs", "1"], runner=RUNNER) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert lines[-1].strip() == "caught 2/2"
    assert main(["bugs", "matrix", "--presets", "nope"], runner=RUNNER) == 2


def test_docs_catalogue_table_is_current():
    from pathlib import Path

    from cpsim.cmd.bugs import list_markdown
    data = (Path(__file__).resolve().parents[1] / "data" / "bugs" / "matrix.md").read_text()
    section = data.split("<!-- bugs-list:begin -->\n")[1].split("<!-- bugs-list:end -->")[0]
    assert section.strip() == list_markdown().strip(), "run scripts/update_bugs_doc.py"
    matrix = data.split("<!-- bugs-matrix:begin -->\n")[1].split("<!-- bugs-matrix:end -->")[0]
    assert f"caught {len(NAMES)}/{len(NAMES)}" in matrix
    assert all(f"`{n}`" in matrix for n in NAMES)


def test_old_mtp_formula_hides_up_to_mtp3():
    # max_num_batched_tokens + 2 x max_num_reqs >= ... + (spec - 1) x max_num_reqs iff spec <= 3.
    import dataclasses
    f = faults.get("mtp-draft-capacity")
    s = f.trigger()
    assert f.knobs_for(s) == f.knobs
    for spec, short in ((3, False), (4, True)):
        t = s.replace(limits=dataclasses.replace(s.limits, num_speculative_tokens=spec))
        assert (f.knobs_for(t).buffer_size < t.limits.slot_buffer_size) is short

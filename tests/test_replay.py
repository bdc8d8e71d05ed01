"""Prefix-cache replay padding: the scenario rules, cpsim's kernel, the user's kernel (--kernel-replay)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from cpsim import cli, kernels
from cpsim import scenario as sc
from cpsim.errors import ConfigError
from cpsim.presets import preset

kernels.use_interpreter()

from cpsim.check import coordinator, reference  # noqa: E402
from cpsim.allocator import allocate_rank, allocate_world  # noqa: E402
from cpsim.layout import PAD_SLOT_ID  # noqa: E402
from cpsim.paths import PATHS, run_path  # noqa: E402
from cpsim.kernels.under_test import ABIS, to_record, with_replay  # noqa: E402
from kernel_load import from_record, load  # noqa: E402
from cpsim.plugin.testing import check_kernel  # noqa: E402
from cpsim.run.world import run_virtual  # noqa: E402
from mutants import mutant  # noqa: E402
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

HERE = Path(__file__).parent / "kernels"
USER = f"{HERE}/vllm_replay_pad_abi.py:_pad_replayed_slots_kernel"
BITS = f"{HERE}/vllm_replay_pad_bits_abi.py:_pad_replayed_slots_kernel"
OURS = "cpsim.kernels.replay_pad:_pad_replayed_slots_kernel"


def _replay_scenario(**request) -> sc.Scenario:
    """CP 2: a cacheable group, a ring that left prefix caching with a window of 8."""
    r = dict(dict(context_len=16, num_tokens=12, kind="replay", replay_start=12), **request)
    return sc.Scenario("replay", sc.CPConfig(dcp=2, interleave=4),
                       (sc.KVGroup("attn", block_size=8, num_blocks=32),
                        sc.KVGroup("swa", kind="sliding_window", block_size=8, cp_sharded=False, num_blocks=8,
                                   prefix_cacheable=False, prefix_replay_tokens=8)),
                       sc.Limits(max_model_len=128, max_num_reqs=2, max_num_batched_tokens=32),
                       sc.Batch((sc.Request(**r),)))


# ---- the scenario --------------------------------------------------------------------------

def test_replay_mask_is_the_replayed_positions_of_the_chunk():
    s = sc.validate(_replay_scenario())  # positions 16..27, replayed [12, 20)
    assert s.replay_window == 8
    assert s.replay_mask().nonzero()[0].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("change,field,needle", [
    (dict(request=dict(replay_start=17)), "batch.requests[0].replay_start", "inside the replayed range [17, 25)"),
    (dict(request=dict(replay_start=8)), "batch.requests[0].replay_start", "context_len is 16"),
    (dict(request=dict(replay_start=-1)), "batch.requests[0].replay_start", ">= 0"),
    (dict(request=dict(num_tokens=4, padded_drafts=1)), "batch.requests[0].replay_start", "is a prefill"),
    (dict(window=0), "batch.requests[0].replay_start", "no group declares prefix_replay_tokens"),
    (dict(cacheable=True), "groups[1](swa).prefix_cacheable", "not prefix-cacheable"),
    (dict(mamba=True), "groups[2](state).prefix_replay_tokens", "mamba group has no slot mapping"),
], ids=["start-after-chunk", "chunk-after-window", "negative", "drafts", "no-window", "cacheable-window",
        "mamba-window"])
def test_bad_replay_is_rejected_naming_field_and_rule(change, field, needle):
    s = _replay_scenario(**change.get("request", {}))
    g = list(s.groups)
    if "window" in change:
        g[1] = dataclasses.replace(g[1], prefix_replay_tokens=change["window"])
    if change.get("cacheable"):
        g[1] = dataclasses.replace(g[1], prefix_cacheable=True)
    if change.get("mamba"):
        g.append(sc.KVGroup("state", kind="mamba", block_size=8, cp_sharded=False, num_blocks=4,
                            prefix_replay_tokens=4))
    with pytest.raises(ConfigError) as e:
        sc.validate(s.replace(groups=tuple(g)))
    assert e.value.field == field and needle in e.value.rule


@pytest.mark.parametrize("patch,needle", [
    ({"replay_start": True}, "replay_start"), ({"replay_start": "12"}, "replay_start"),
    ({"replay_start": 2**40}, "replay_start"),
], ids=["bool", "string", "huge"])
def test_bad_replay_json_is_exit_2(tmp_path, capsys, patch, needle):
    d = sc.validate(_replay_scenario()).to_dict()
    d["batch"]["requests"][0].update(patch)
    f = tmp_path / "s.json"
    f.write_text(json.dumps(d))
    assert cli.main(["run", "--scenario", str(f), "--paths", "v1"], runner=RUNNER) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) <= 3


def test_fields_at_their_defaults_keep_old_fingerprints():
    s = preset("default")
    d = s.to_dict()
    assert "replay_start" not in d["batch"]["requests"][0]
    assert "prefix_cacheable" not in d["groups"][0] and "prefix_replay_tokens" not in d["groups"][0]
    r = sc.validate(_replay_scenario())
    assert sc.Scenario.from_dict(json.loads(r.canonical_json())) == r


def test_preset_replays_in_first_later_and_inside_chunks():
    s = sc.validate(preset("prefix-replay"))
    starts = [(r.context_len, r.num_tokens, r.replay_start) for r in s.batch.requests if r.replay_start]
    assert starts == [(896, 300, 896), (1664, 100, 1600), (3000, 50, 3000)]
    assert int(s.replay_mask().sum()) == 128 + 64 + 50
    assert [g.pads_replay for g in s.groups] == [True, True, False, False]


# ---- cpsim's kernel ------------------------------------------------------------------------

def test_our_kernel_pads_exactly_the_replayed_tokens_of_the_listed_groups():
    """Launched alone on a buffer of known values: only listed rows, only replayed positions change."""
    from cpsim.kernels.replay_pad import _pad_replayed_slots_kernel
    G, T = 3, 40
    slots = torch.arange(G * T, dtype=torch.int64).reshape(G, T) + 100
    want = slots.clone()
    qsl = torch.tensor([0, 10, 30, 33], dtype=torch.int32)
    pos = torch.cat([torch.arange(50, 60), torch.arange(7, 27), torch.arange(3, 6), torch.zeros(7, dtype=torch.int64)])
    starts = torch.tensor([52, 5, 0], dtype=torch.int32)  # request 2 does not replay
    # Request 0: positions 50..59, replayed [52, 58) -> tokens 2..7; request 1: 7..26, [5, 11) -> tokens 10..13.
    for g in (0, 2):
        want[g, 2:8] = PAD_SLOT_ID
        want[g, 10:14] = PAD_SLOT_ID
    _pad_replayed_slots_kernel[(3,)](slots, slots.stride(0), torch.tensor([0, 2], dtype=torch.int32), qsl, pos,
                                     starts, 6, PAD_SLOT_ID, NUM_GROUPS=2, BLOCK=8)
    assert torch.equal(slots, want)


@pytest.mark.parametrize("name", ["prefix-replay"])
def test_every_path_matches_the_reference_on_every_rank(name):
    s = sc.validate(preset(name))
    for rank in range(s.cp.world):
        allocs = allocate_rank(s, rank)
        for path in PATHS:
            out = run_path(path, s, allocs, rank)
            if out is None:
                continue
            want = reference.rank_slots(s, allocs, rank, out.slots.shape[1])
            for gi, g in enumerate(s.groups):
                if out.enabled[gi]:
                    assert torch.equal(out.slots[gi], want[gi]), (path, rank, g.name)


def test_replayed_tokens_keep_slots_in_the_groups_that_left_prefix_caching():
    s = sc.validate(preset("prefix-replay"))
    gathered = run_virtual(s, ["v2"], runner=RUNNER)
    verdicts = coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world)
    assert coordinator.passed(verdicts)
    x = gathered["v2"].slots[:, :, : s.batch.num_tokens]
    rep = torch.from_numpy(s.replay_mask())
    assert bool((x[:, 0][:, rep] == PAD_SLOT_ID).all()) and bool((x[:, 1][:, rep] == PAD_SLOT_ID).all())
    assert bool((x[:, 2][:, rep] != PAD_SLOT_ID).all())  # the ring every rank holds keeps them


# ---- the user's kernel: ABI, adapter, one-line bugs, CLI -------------------------------------

@pytest.mark.parametrize("spec,abi", [(USER, "vllm-replay-pad"), (BITS, "vllm-replay-pad-bits"),
                                      (OURS, "vllm-replay-pad")], ids=["user", "bits", "ours"])
def test_replay_abi_is_detected_from_parameter_names(spec, abi):
    assert load(spec, "replay").abi == abi


def test_replay_kernel_cannot_stand_in_for_a_path_and_vice_versa():
    with pytest.raises(ConfigError, match="cannot stand in for the v1 path"):
        load(USER, "v1")
    with pytest.raises(ConfigError, match="cannot stand in for the replay path"):
        load(f"{HERE}/ascend_v1_abi.py:_compute_slot_mapping_kernel", "replay")
    assert ABIS["vllm-replay-pad"].paths == ("replay",)


@pytest.mark.parametrize("spec", [USER, BITS], ids=["user", "bits"])
def test_user_replay_kernels_pass_every_invariant(spec):
    results = check_kernel(spec, runner=RUNNER)
    assert any(v.invariant == "replayed-is-pad" and v.status == "pass" for vs in results.values() for v in vs)


@pytest.mark.parametrize("spec,old,new,invariant", [
    (USER, "(pos >= start)", "(pos > start)", "replayed-is-pad"),                    # the window one late
    (BITS, "if (CACHEABLE_GROUPS >> g) & 1:", "if True:", "replayed-is-pad"),       # every group padded
    (USER, "(pos - start < window)", "(pos - start <= window)", "exactly-one-owner"),  # one past the window
], ids=["start-exclusive", "every-group", "end-inclusive"])
def test_one_line_replay_bug_fails_with_the_expected_invariant(tmp_path, spec, old, new, invariant):
    with pytest.raises(AssertionError) as e:
        check_kernel(mutant(tmp_path, spec, old, new), scenarios=["prefix-replay"], path="v2", runner=RUNNER)
    assert f"✗ {invariant} [v2]" in str(e.value)


def test_cli_run_with_a_user_replay_kernel(tmp_path, capsys):
    assert cli.main(["run", "--scenario", "prefix-replay", "--paths", "v1,v2", "--kernel-replay", USER], runner=RUNNER) == 0
    out = capsys.readouterr().out
    assert "all invariants hold" in out and f"replay padding {USER} (vllm-replay-pad)" in out
    bad = mutant(tmp_path, USER, "(pos >= start)", "(pos > start)")
    assert cli.main(["run", "--scenario", "prefix-replay", "--paths", "v1,v2", "--kernel-replay", bad], runner=RUNNER) == 1
    assert "replayed-is-pad" in capsys.readouterr().out


def test_cli_replay_kernel_with_a_user_path_kernel(capsys):
    v1 = f"{HERE}/ascend_v1_abi.py:_compute_slot_mapping_kernel"
    assert cli.main(["run", "--scenario", "prefix-replay", "--paths", "v1", "--kernel-v1", v1,
                     "--kernel-replay", BITS], runner=RUNNER) == 0
    out = capsys.readouterr().out
    assert f"{v1} (ascend-v1) + replay padding {BITS}" in out


@pytest.mark.parametrize("argv,needle", [
    (["--scenario", "mtp", "--kernel-replay", USER], "no request of the scenario replays"),
    (["--scenario", "prefix-replay", "--kernel-replay", f"{HERE}/ascend_v1_abi.py:_compute_slot_mapping_kernel"],
     "cannot stand in for the replay path"),
    (["--scenario", "prefix-replay", "--paths", "v1", "--kernel-v1", USER], "cannot stand in for the v1 path"),
], ids=["no-replay", "path-kernel-as-replay", "replay-kernel-as-path"])
def test_cli_replay_kernel_misuse_is_exit_2(capsys, argv, needle):
    assert cli.main(["run", *argv], runner=RUNNER) == 2
    assert needle in capsys.readouterr().err


def test_replay_kernel_survives_the_record_round_trip():
    k = with_replay(None, load(USER, "replay"))
    rec = to_record({"v2": k}, ["v1", "v2"])
    assert rec["v1"] == "builtin" and rec["v2"]["spec"] == "builtin"
    assert rec["v2"]["replay"] == {"spec": USER, "abi": "vllm-replay-pad", "shim_vllm": False}
    back = from_record(json.loads(json.dumps(rec)))
    assert list(back) == ["v2"] and back["v2"].builtin and back["v2"].replay.abi == "vllm-replay-pad"

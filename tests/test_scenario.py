"""Scenario: validation names the field and the rule; serialisation round-trips."""

import dataclasses

import pytest

from cpsim import scenario as sc
from cpsim.presets import PRESETS, preset
from cpsim.random_scenarios import random_scenario
from cpsim.validate import load_scenario
from cpsim.errors import ConfigError


@pytest.mark.parametrize("name", PRESETS)
def test_presets_are_valid(name):
    s = sc.validate(preset(name))
    assert s.batch.num_tokens > 0


def test_default_preset_shape():
    s = preset("default")
    assert s.cp.world == 8
    kinds = [(g.kind, g.block_size, g.b) for g in s.groups]
    assert ("attention", 128, 64) in kinds and ("attention", 16, 16) in kinds
    assert any(g.kind == "mamba" for g in s.groups)
    assert s.batch.num_tokens_padded > s.batch.num_tokens
    assert -1 in s.batch.idx_mapping
    assert {r.kind for r in s.batch.requests} >= {"prefill", "chunked", "decode", "spec"}


def test_long_prefill_is_128k():
    assert preset("long-prefill").batch.num_tokens == 128 * 1024


def _err(s) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        sc.validate(s)
    return e.value


def test_interleave_must_divide_block_size():
    e = _err(preset("default", interleave=48))
    assert e.field == "cp.interleave"
    assert "interleave 48 must divide physical block size 128" in str(e)
    sc.validate(preset("default", interleave=48).replace(allow_invalid=True))


@pytest.mark.parametrize("change, field, words", [
    (lambda s: s.replace(cp=sc.CPConfig(dcp=0)), "cp.dcp", ">= 1"),
    (lambda s: s.replace(groups=()), "groups", "at least one"),
    (lambda s: s.replace(groups=(sc.KVGroup("a", block_size=128, kernel_block_size=48),)),
     "kernel_block_size", "must divide physical block size 128"),
    (lambda s: s.replace(groups=(sc.KVGroup("a", kind="ssm"),)), "kind", "must be one of"),
    (lambda s: s.replace(groups=(sc.KVGroup("a"), sc.KVGroup("a"))), "groups", "unique"),
    (lambda s: s.replace(groups=(sc.KVGroup("w", kind="sliding_window", block_size=64),)),
     "cp_sharded", "cannot be CP-sharded"),
    (lambda s: s.replace(limits=dataclasses.replace(s.limits, max_model_len=100)), "batch.requests", "max_model_len"),
    (lambda s: s.replace(limits=dataclasses.replace(s.limits, max_num_reqs=2)), "batch.requests", "max_num_reqs"),
    (lambda s: s.replace(batch=dataclasses.replace(s.batch, num_tokens_padded=5)), "num_tokens_padded", "must lie in"),
    (lambda s: s.replace(batch=dataclasses.replace(s.batch, idx_mapping=(0, 0))), "idx_mapping", "entries"),
    (lambda s: s.replace(groups=(sc.KVGroup("a", num_blocks=3),)), "num_blocks", "too small"),
    (lambda s: s.replace(groups=(sc.KVGroup("a", block_size=128, kernel_block_size=16, num_blocks=2**30),)),
     "num_blocks", "int32"),
])
def test_bad_input_names_field_and_rule(change, field, words):
    e = _err(change(preset("default")))
    assert field in e.field and words in e.rule


def test_a_dummy_request_with_tokens_is_padding_and_holds_no_blocks():
    """vLLM 0.33.0's MRV2 speculator keeps the tokens of its graph-padding rows (idx_mapping -1): every
    one of them is padding, and the request holds no blocks (it has no table row)."""
    s = preset("default")
    reqs = list(s.batch.requests)
    dummy = s.batch.idx_mapping.index(-1)
    reqs[dummy] = sc.Request(700, 3, "dummy")
    s = sc.validate(s.replace(batch=dataclasses.replace(s.batch, requests=tuple(reqs))))
    qsl = s.batch.query_start_loc()
    assert s.batch.has_padding and s.batch.padding_mask()[qsl[dummy]:qsl[dummy + 1]].all()
    assert s.batch.allocated_lens()[dummy] == 0


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_round_trip_keeps_fingerprint(tmp_path, suffix):
    s = preset("hybrid-mamba", seed=3)
    path = tmp_path / f"s{suffix}"
    s.dump(path)
    back = load_scenario(path)
    assert back == s
    assert back.fingerprint() == s.fingerprint()


def test_fingerprint_changes_with_any_field():
    s = preset("default")
    assert s.fingerprint() == preset("default").fingerprint()
    assert s.fingerprint() != preset("default", seed=1).fingerprint()
    assert s.fingerprint() != s.replace(cp=dataclasses.replace(s.cp, interleave=8)).fingerprint()


def test_load_reports_bad_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_scenario(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_scenario(tmp_path / "missing.json")
    bad.write_text('{"cp": {}}')
    with pytest.raises(ConfigError, match="groups"):
        load_scenario(bad)


@pytest.mark.parametrize("seed", range(40))
def test_random_scenarios_are_valid_and_seeded(seed):
    s = random_scenario(seed)
    assert random_scenario(seed) == s
    sc.validate(s)


def test_to_dict_walk_is_asdict():
    """``Scenario.to_dict`` walks the dataclasses itself (``scenario._plain``, faster than ``asdict``):
    on drawn scenarios and on values a scenario does not hold today (lists, dicts, named tuples, arrays)
    it gives what ``dataclasses.asdict`` gives, container types included."""
    import collections

    import numpy as np
    from hypothesis import HealthCheck, given, settings
    from cpsim.fuzz import scenarios

    @settings(max_examples=80, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(scenarios(max_programs=12))
    def same(s):
        assert repr(sc._plain(s)) == repr(dataclasses.asdict(s))

    same()
    Pair = collections.namedtuple("Pair", "a b")

    @dataclasses.dataclass
    class Odd:
        items: list
        table: dict
        pair: Pair
        array: np.ndarray
        nested: tuple

    odd = Odd([sc.CPConfig(2)], {"k": sc.Limits()}, Pair(sc.Request(1, 2), 3), np.arange(3),
              ((sc.KVGroup("g"),), [1.5, None]))
    assert repr(sc._plain(odd)) == repr(dataclasses.asdict(odd))
    assert sc._plain(odd)["array"] is not odd.array  # copied, as asdict copies what it does not walk

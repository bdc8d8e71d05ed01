"""A staged world (``cpsim.paths.prep``: the ranks of a path prepared together) hands every rank
exactly what a rank run alone would: same slots, guard entries, widths and entry sizes, with and
without the catalogue's faults, and when its tables are too big to stage."""

import random

import pytest
import torch

from cpsim import faults
from cpsim.allocator import allocate_world
from cpsim.fuzz import explore, space
from cpsim.paths import PATHS, Knobs, run_path
from cpsim.paths import prep as _stage


def _fuzz_scenarios(n: int):
    rng, recent, out = random.Random(7), {}, []
    for i in range(n):
        d = space.RandomDraw(rng, explore.prefix(rng, recent))
        out.append(space.build(d))
        recent[i % explore.RECENT] = d.choices
    return out


# The ranks run alone, per (scenario, path), for the fuzz chunks' two read-back modes: computed once.
_ALONE: dict[tuple[str, str], list] = {}


def _same_world(s, knobs: Knobs | list[Knobs] = Knobs(), paths=PATHS, defer: bool = False,
                alone_of: dict | None = None) -> int:
    """Rank outputs compared between each rank run alone and the ranks staged together; ``alone_of``:
    a cache of the alone runs (default knobs only) to reuse across calls."""
    allocs = allocate_world(s)
    ranks = range(s.cp.world)
    per_rank = knobs if isinstance(knobs, list) else [knobs] * s.cp.world
    compared = 0
    for path in paths:
        key = (s.fingerprint(), path)
        alone = None if alone_of is None else alone_of.get(key)
        if alone is None:
            alone = [run_path(path, s, allocs[r], r, "cpu", per_rank[r]) for r in ranks]
            if alone_of is not None:
                alone_of[key] = alone
        stage = _stage.for_ranks(s, {r: allocs[r] for r in ranks}, "cpu", defer=defer)
        together = [run_path(path, s, allocs[r], r, "cpu", per_rank[r], inputs=stage.for_rank(r)) for r in ranks]
        if defer:
            assert all(o is None or o.guard is None for o in together)  # not read back yet
            stage.settle()
        for r, (a, b) in enumerate(zip(alone, together)):
            assert (a is None) == (b is None)
            if a is None:
                continue
            where = f"{path} rank {r} of {s.to_dict()}"
            assert torch.equal(a.slots, b.slots), where
            assert torch.equal(a.guard, b.guard), where
            assert (a.enabled, a.widths, a.entry_sizes) == (b.enabled, b.widths, b.entry_sizes), where
            compared += 1
    return compared


@pytest.mark.parametrize("defer", [False, True], ids=["read-back-per-rank", "read-back-together"])
@pytest.mark.parametrize("chunk", range(4))
def test_staged_ranks_get_what_a_rank_run_alone_gets(chunk, defer):
    scenarios = _fuzz_scenarios(48)[chunk::4]
    assert sum(_same_world(s, defer=defer, alone_of=_ALONE) for s in scenarios) >= len(scenarios) * 3


@pytest.mark.parametrize("defer", [False, True], ids=["read-back-per-rank", "read-back-together"])
@pytest.mark.parametrize("name", faults.names())
def test_staged_ranks_keep_the_faults_outputs(name, defer):
    f = faults.get(name, "fault")
    s = f.trigger()
    assert _same_world(s, f.knobs_for(s), paths=f.paths or PATHS, defer=defer) > 0


@pytest.mark.parametrize("name", [n for n in faults.names() if faults.get(n, "fault").trigger().cp.world > 1])
def test_a_fault_on_one_rank_stays_on_that_rank_when_staged(name):
    """``--inject-rank``: the staged ranks' knobs differ; what they share must not carry one rank's
    fault to another (the faults whose trigger has more than one rank)."""
    from cpsim.run.world import rank_knobs
    f = faults.get(name, "fault")
    s = f.trigger()
    assert _same_world(s, rank_knobs(s, f.knobs_for(s), s.cp.world - 1), paths=f.paths or PATHS) > 0


def test_tables_too_big_to_stage_are_built_per_rank(monkeypatch):
    """A CP > 1 draw whose v1 tables are staged at the default bound (the first of the space's draws that
    are), then the same run with a bound of 0: every table built per rank run, the outputs unchanged."""
    from cpsim.paths import _guard

    built = []  # tables built for several ranks at once
    real = _guard.tables
    monkeypatch.setattr(_guard, "tables", lambda entries, *a: (len(entries) > 1 and built.append(a))
                        or real(entries, *a))
    for s in [x for x in _fuzz_scenarios(48) if x.cp.world > 1][:8]:
        _same_world(s, paths=["v1"])
        if built:
            break
    assert built  # staged at the default bound
    built.clear()
    monkeypatch.setattr(_stage, "TABLE_BYTES", 0)
    assert _same_world(s, paths=["v1"]) == s.cp.world
    assert not built  # every table built per rank run, outputs unchanged


@pytest.mark.parametrize("bound", [4 << 10, 64 << 10, 1 << 20])
def test_tables_partly_staged_give_what_a_rank_run_alone_gets(monkeypatch, bound):
    """With some of a rank's tables staged and others built for it alone, v2's per-rank arrays (table
    pointers) must not be made for every rank at once: another rank's unstaged table would be built
    afresh for them and freed."""
    monkeypatch.setattr(_stage, "TABLE_BYTES", bound)
    made = []
    real = _stage.Stage.per_rank
    monkeypatch.setattr(_stage.Stage, "per_rank", lambda self, *a: made.append(r := real(self, *a)) or r)
    for s in [x for x in _fuzz_scenarios(48) if x.cp.world > 1][:8]:
        assert _same_world(s, paths=["v2"]) == s.cp.world
    assert any(m is None for m in made) and any(m is not None for m in made)


def test_a_users_kernel_is_not_staged():
    s = _fuzz_scenarios(1)[0]
    alone = _stage.for_ranks(s, {0: allocate_world(s)[0]}, "cpu", builtin=False)
    assert type(alone.for_rank(0)) is _stage.PerRank
    assert isinstance(_stage.for_ranks(s, {0: allocate_world(s)[0]}, "cpu").for_rank(0), _stage.Staged)


def test_inputs_for_another_scenario_or_device_are_refused():
    s, other = _fuzz_scenarios(2)
    allocs = allocate_world(s)
    with pytest.raises(ValueError, match="another scenario or device"):
        run_path("v1", s, allocs[0], 0, "cpu", inputs=_stage.PerRank(other, "cpu"))
    with pytest.raises(ValueError, match="another scenario or device"):
        run_path("v1", s, allocs[0], 0, "cpu", inputs=_stage.PerRank(s, "meta"))


def test_staged_tensors_are_aligned_as_fresh_ones():
    """Triton specialises a kernel on its pointers' 16-byte alignment: a staged rank's table and output
    rows must be as aligned as a fresh allocation's, or the device compiles extra variants."""
    from cpsim.paths import v1

    for s in [x for x in _fuzz_scenarios(48) if x.cp.world > 2][:6]:
        allocs = allocate_world(s)
        stage = _stage.for_ranks(s, {r: allocs[r] for r in range(s.cp.world)}, "cpu")
        for r in range(s.cp.world):
            inputs = stage.for_rank(r)
            assert isinstance(inputs, _stage.Staged)
            out = inputs.buffer(range(len(s.groups)), s.limits.slot_buffer_size + 3, torch.int64)
            assert out.data_ptr() % 16 == 0
            for gi, g in enumerate(s.groups):
                t = inputs.table(allocs[r][gi], v1.table_shape(s, g, Knobs()))
                assert t.data_ptr() % 16 == 0, (r, gi, t.shape)

"""Layout math: the virtual-block formula against the global rule, by property."""

import torch
from hypothesis import given, strategies as st

from cpsim import layout

# (world, interleave, block size) with interleave dividing the block size.
valid = st.tuples(st.integers(1, 16), st.integers(0, 6), st.integers(0, 5)).map(
    lambda t: (t[0], 2 ** t[1], 2 ** t[1] * 2 ** t[2] * (3 if t[2] == 5 else 1)))


def brute_owned_before(p: int, rank: int, world: int, interleave: int) -> int:
    return sum(1 for q in range(p) if (q // interleave) % world == rank)


@given(valid, st.integers(0, 5000))
def test_virtual_block_owner_equals_global_rule(cfg, start):
    world, interleave, block = cfg
    pos = torch.arange(start, start + 3 * block * world, dtype=torch.int64)
    _, vo = layout.virtual_split(pos, block, world)
    assert torch.equal(layout.virtual_owner(vo, world, interleave), layout.owner_rank(pos, world, interleave))


@given(valid, st.integers(0, 3000))
def test_local_index_is_dense_count_of_owned_positions(cfg, length):
    world, interleave, block = cfg
    pos = torch.arange(length, dtype=torch.int64)
    owner = layout.owner_rank(pos, world, interleave)
    local = layout.local_index(pos, block, world, interleave)
    for rank in range(world):
        mine = local[owner == rank]
        # Dense: the rank's tokens take local indices 0, 1, 2, ... in order.
        assert torch.equal(mine, torch.arange(len(mine)))
        assert len(mine) == layout.owned_before(length, rank, world, interleave)
        assert layout.blocks_touched(length, rank, block, world, interleave) == layout.cdiv(len(mine), block)


@given(st.integers(1, 8), st.integers(1, 64), st.integers(0, 300), st.integers(0, 7))
def test_owned_before_matches_brute_force(world, interleave, p, rank):
    rank %= world
    assert layout.owned_before(p, rank, world, interleave) == brute_owned_before(p, rank, world, interleave)


@given(valid, st.integers(1, 4000))
def test_every_position_has_exactly_one_owner(cfg, length):
    world, interleave, _ = cfg
    pos = torch.arange(length, dtype=torch.int64)
    counts = torch.bincount(layout.owner_rank(pos, world, interleave), minlength=world)
    assert int(counts.sum()) == length
    assert int(counts.max() - counts.min()) <= interleave  # balance


@given(valid, st.integers(0, 3), st.integers(0, 2000))
def test_table_index_stays_inside_the_rank_blocks(cfg, hybrid, length):
    world, interleave, block = cfg
    kernel = max(block // 2 ** hybrid, 1)
    if block % kernel:
        kernel = block
    pos = torch.arange(length, dtype=torch.int64)
    k, o, _ = layout.table_index(pos, block, kernel, world, interleave)
    assert bool((o < kernel).all())
    local = layout.local_index(pos, block, world, interleave)
    # The logical entry k of kernel block size b, at offset o, is local slot k*b + o.
    assert torch.equal(k * kernel + o, local)


def test_invalid_layout_breaks_the_global_rule():
    # interleave 48 does not divide 128: the virtual-block owner drifts from (p // I) % N.
    pos = torch.arange(4096, dtype=torch.int64)
    _, vo = layout.virtual_split(pos, 128, 8)
    assert not torch.equal(layout.virtual_owner(vo, 8, 48), layout.owner_rank(pos, 8, 48))


def test_table_width_and_max_index():
    assert layout.table_width(8192, 128, 8) == 8
    assert layout.table_width(8193, 128, 8) == 9
    # Hybrid blocks: the logical table is BPK times wider and its last index is used.
    assert layout.max_table_index(8192, 128, 64, 8, 16) == 8 * 2 - 1
    assert layout.max_table_index(1000, 16, 16, 1, 1) == 62

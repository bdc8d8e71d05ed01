"""Every kernel equals the reference (SPEC §2) under the Triton interpreter."""

import pytest
import torch

from cpsim import kernels
from cpsim.check import reference
from cpsim import scenario as sc
from cpsim.presets import preset
from cpsim.random_scenarios import random_scenario
from cpsim.allocator import allocate_rank
from cpsim.layout import PAD_SLOT_ID
from cpsim.paths import PATHS, run_path


def _check_rank(s: sc.Scenario, rank: int, device: str = "cpu", paths=PATHS) -> int:
    allocs = allocate_rank(s, rank)
    want = reference.rank_slots(s, allocs, rank, s.limits.slot_buffer_size)
    ran = 0
    for path in paths:
        out = run_path(path, s, allocs, rank, device)
        if out is None:
            assert path == "v1-fused" and s.cp.world > 1
            continue
        ran += 1
        for gi, g in enumerate(s.groups):
            if not out.enabled[gi]:
                assert path != "v2" and not g.slot_mapped  # only v1 skips (mamba) groups
                continue
            got = out.slots[gi].cpu()
            bad = (got != want[gi]).nonzero().flatten()
            assert len(bad) == 0, (f"{path} group {g.name} rank {rank}: {len(bad)} entries differ, "
                                   f"first at {bad[:5].tolist()}: got {got[bad[:5]].tolist()} "
                                   f"want {want[gi][bad[:5]].tolist()} ({s.to_dict()})")
    return ran


@pytest.mark.parametrize("seed", range(200))
def test_kernels_match_reference_on_random_scenarios(seed, device):
    s = random_scenario(seed, max_world=8, max_groups=4, max_reqs=8, max_model_len=65536)
    assert _check_rank(s, seed % s.cp.world, device) >= 3


@pytest.mark.parametrize("name", ["default", "hybrid-mamba", "mtp"])
def test_kernels_match_reference_on_presets_every_rank(name, device):
    s = sc.validate(preset(name))
    for rank in range(s.cp.world):
        _check_rank(s, rank, device)


def test_seed_article_worked_example(device):
    """Two requests [0, 5) and [5, 10), B = 128, 8192 entries: slots, then PAD."""
    if device == "cpu":
        kernels.use_interpreter()
    from cpsim.kernels.triton_v1 import _compute_slot_mapping_kernel

    gen = torch.Generator().manual_seed(0)
    table = torch.randint(0, 320, (64, 320), dtype=torch.int32, generator=gen).to(device)
    qsl = torch.tensor([0, 5, 10], dtype=torch.int32, device=device)
    positions = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3, 4], dtype=torch.int64, device=device)
    out = torch.zeros(8192, dtype=torch.int32, device=device)
    _compute_slot_mapping_kernel[(3,)](
        10, 8192, qsl, positions, table, table.stride(0), 128, out,
        KV_CACHE_BLOCK_SIZE=128, BLOCKS_PER_KV_BLOCK=1, TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0,
        CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, TILE_BLOCK_SIZE=1024,
        BLOCK_TABLE_WINDOW_SIZE=kernels.window_size(1024, 128))
    assert kernels.window_size(1024, 128) == 16
    out, table = out.cpu(), table.cpu()
    expected = [int(table[r, p // 128]) * 128 + p % 128 for r in (0, 1) for p in range(5)]
    assert out[:10].tolist() == expected
    assert bool((out[10:] == PAD_SLOT_ID).all())


def test_seed_article_cp_example(device):
    """CP 2, I = B = 128: rank 0 owns 0..127 and 256..383, packed densely into its blocks."""
    s = sc.Scenario("seed-cp", sc.CPConfig(dcp=2, interleave=128), (sc.KVGroup("a", block_size=128, num_blocks=64),),
                    sc.Limits(max_model_len=1024, max_num_reqs=1, max_num_batched_tokens=512),
                    sc.Batch((sc.Request(0, 512),)))
    for rank in (0, 1):
        allocs = allocate_rank(s, rank)
        blocks = allocs[0].blocks[0].tolist()
        out = run_path("v1", s, allocs, rank, device).slots[0, :512].cpu()
        mine = list(range(rank * 128, rank * 128 + 128)) + list(range(256 + rank * 128, 384 + rank * 128))
        assert [int(out[p]) for p in mine] == [blocks[j // 128] * 128 + j % 128 for j in range(256)]
        others = [p for p in range(512) if p not in mine]
        assert all(int(out[p]) == PAD_SLOT_ID for p in others)


def test_interpreter_type_names_are_the_ones_triton_formats():
    """The speed-up in cpsim.kernels._interp computes block_type / tuple_type names on first
    read; they must equal what Triton's own constructors write, and stay assignable."""
    import os
    import triton.language as tl

    from cpsim.kernels import _interp
    from cpsim.paths._inputs import prepare_triton

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("compiled kernels (CPSIM_TEST_DEVICE): the interpreter is not in use")
    prepare_triton(torch.device("cpu"))
    if not _interp.ORIGINALS:
        pytest.skip("this Triton's constructors differ: the speed-up is not installed")
    core = tl.core
    cases = [(core.block_type, (tl.int32, [4, 8])), (core.block_type, (tl.float32, [16])),
             (core.tuple_type, ([tl.int64, core.constexpr_type(3)],)),
             (core.tuple_type, ([tl.int8], ["f"]))]
    for cls, args in cases:
        lazy = cls(*args)
        eager = object.__new__(cls)
        _interp.ORIGINALS[cls.__name__](eager, *args)  # Triton's own __init__ writes the name
        assert lazy.name == eager.name and str(lazy) == str(eager) and lazy == eager
        assert "[" in lazy.name or "<" in lazy.name
        lazy.name = "renamed"
        assert str(lazy) == "renamed"


def test_large_block_ids_and_slots_stay_exact(device):
    """Block ids above 2^24 and slots above 2^31: no float32 or int32 shortcut."""
    s = sc.Scenario("huge", sc.CPConfig(dcp=2, interleave=16),
                    (sc.KVGroup("a", block_size=256, kernel_block_size=128, num_blocks=2**24),),
                    sc.Limits(max_model_len=1 << 20, max_num_reqs=2, max_num_batched_tokens=64),
                    sc.Batch((sc.Request(900_000, 8), sc.Request(5, 3))))
    sc.validate(s)
    for rank in (0, 1):
        allocs = allocate_rank(s, rank)
        assert max(int(b.max()) for b in allocs[0].blocks if len(b)) * 2 > 2**24
        _check_rank(s, rank, device)


def test_interpreter_overflow_check_is_off_only_while_it_cannot_fire():
    """The speed-up in cpsim.kernels._interp drops int32 overflow checks whose assert is dead
    (debug off); int32 products still wrap as on a GPU."""
    import os
    import triton
    import triton.language as tl
    from triton.runtime import interpreter as it

    from cpsim.paths._inputs import prepare_triton

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("compiled kernels (CPSIM_TEST_DEVICE): the interpreter is not in use")
    prepare_triton(torch.device("cpu"))  # what every path does before its first launch
    opts = it.interpreter_builder.options
    assert not opts.debug and not opts.sanitize_overflow

    @triton.jit
    def mul32(x_ptr, out_ptr, k):
        x = tl.load(x_ptr + tl.arange(0, 4))
        tl.store(out_ptr + tl.arange(0, 4), x * k)

    x = torch.tensor([2**24, 2**24 + 1, -3, 7], dtype=torch.int32)
    out = torch.empty_like(x)
    mul32[(1,)](x, out, 128)
    want = [(v * 128 + 2**31) % 2**32 - 2**31 for v in x.tolist()]
    assert out.tolist() == want

"""What the Ascend compile check compiles: kernels x the constexpr combinations cpsim launches.

A kernel is one ``Entry`` (where it lives, the types of its runtime arguments, and a
function giving its constexpr combinations); adding a kernel to the check is adding
one entry to ``BUILTINS``. Combinations follow what the paths launch
(``cpsim/paths/``): CP sizes 1/2/4/8 (rank N-1), interleaves that divide the block
size, physical/kernel block pairs with BPK 1 and 2, a block size that is not a power
of two, circular (sliding-window) tables at CP 1, the tile kernels' POW2 and
POS_INT32 switches; fault switches stay off. Pure Python: no triton import here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cpsim.kernels import next_pow2, window_size

PAD = -1
PER_REQ_TILE = 1024                 # cpsim/paths/v1.py, v2.py TILE
CP_SIZES = (1, 2, 4, 8)
INTERLEAVES = (1, 16, 64, 128)   # presets use 1, 16, 64, 128 (= B); random scenarios 1..32
# (physical B, kernel b, circular): BPK 1 and 2, small blocks, a block size that is not a power of two.
GROUP_SHAPES = ((128, 128, False), (128, 64, False), (16, 16, False), (96, 48, False), (64, 64, True))
NPU_TILES = (64, 1024)              # cpsim.kernels.tile.NPU_TILE: smallest and largest tile on npu
REQ_BLOCKS = (8, 256)
# One layout per tile kernel also goes through every tile in between and extreme request blocks.
TILE_SWEEP = ((128, 2), (256, 32), (512, 1024))


@dataclass(frozen=True)
class Job:
    """One compilation: ``target`` (``module:attr`` or ``file.py:attr``) with these constexprs."""

    kernel: str
    target: str
    signature: dict
    constants: dict
    shim_vllm: bool = False

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.constants.items())

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "target": self.target, "signature": self.signature,
                "constants": self.constants, "shim_vllm": self.shim_vllm}


@dataclass(frozen=True)
class Entry:
    name: str
    target: str
    signature: dict
    combos: Callable[[], list[dict]]
    note: str = ""

    def jobs(self) -> list[Job]:
        return [Job(self.name, self.target, self.signature, c) for c in self.combos()]


def _cp_layouts(shapes=GROUP_SHAPES):
    """(B, b, circular, N, I): circular tables only unsharded (N = 1), I dividing B."""
    for B, b, circ in shapes:
        for n in CP_SIZES:
            if circ and n > 1:
                continue
            for i in (INTERLEAVES if n > 1 else (16 if B % 16 == 0 else 1,)):
                if B % i == 0:
                    yield B, b, circ, n, i


def _pos_widths(n: int, i: int) -> tuple[bool, ...]:
    """POS_INT32 values compiled: int32 for every layout, int64 (max_model_len >= 2**31) for a subset."""
    return (True, False) if n == 1 or i == 16 else (True,)


def _v1_combos() -> list[dict]:
    return [dict(KV_CACHE_BLOCK_SIZE=B, BLOCKS_PER_KV_BLOCK=B // b, TOTAL_CP_WORLD_SIZE=n, TOTAL_CP_RANK=n - 1,
                 CP_KV_CACHE_INTERLEAVE_SIZE=i, PAD_ID=PAD, TILE_BLOCK_SIZE=PER_REQ_TILE,
                 BLOCK_TABLE_WINDOW_SIZE=window_size(PER_REQ_TILE, b), IS_CIRCULAR=circ, FAULT=0, POS_INT32=p32)
            for B, b, circ, n, i in _cp_layouts() for p32 in _pos_widths(n, i)]


def _min_entries():
    return sorted({b for _, b, _ in GROUP_SHAPES})


def _v1_fused_combos() -> list[dict]:
    return [dict(PAD_ID=PAD, TILE_BLOCK_SIZE=PER_REQ_TILE, BLOCK_TABLE_WINDOW_SIZE=window_size(PER_REQ_TILE, b),
                 FAULT=0, POS_INT32=p32) for b in _min_entries() for p32 in (True, False)]


def _v2_combos() -> list[dict]:
    out = []
    for n in CP_SIZES:
        for i in (INTERLEAVES if n > 1 else (16,)):
            for b in _min_entries():
                for p32 in _pos_widths(n, i):
                    out.append(dict(CP_SIZE=n, CP_INTERLEAVE=i, PAD_ID=PAD, TRITON_BLOCK_SIZE=PER_REQ_TILE,
                                    BLOCK_TABLE_WINDOW_SIZE=window_size(PER_REQ_TILE, b), FAULT=0, POS_INT32=p32))
    return out


def _tile_v1_combos() -> list[dict]:
    out = []
    for B, b, circ, n, i in _cp_layouts():
        for tile, rb, p32 in ((NPU_TILES[-1], REQ_BLOCKS[-1], True),) + (
                ((NPU_TILES[0], REQ_BLOCKS[0], False),) if i == 16 or n == 1 else ()):
            out.append(dict(block_size=b, KV_CACHE_BLOCK_SIZE=B, BLOCKS_PER_KV_BLOCK=B // b, TOTAL_CP_WORLD_SIZE=n,
                            TOTAL_CP_RANK=n - 1, CP_KV_CACHE_INTERLEAVE_SIZE=i, PAD_ID=PAD, TILE=tile,
                            REQ_BLOCK=rb, IS_CIRCULAR=circ, FAULT=0, POS_INT32=p32))
    base = next(c for c in out if c["TOTAL_CP_WORLD_SIZE"] == 8 and c["BLOCKS_PER_KV_BLOCK"] == 2
                and c["CP_KV_CACHE_INTERLEAVE_SIZE"] == 16)
    return out + [dict(base, TILE=t, REQ_BLOCK=rb) for t, rb in TILE_SWEEP]


def _tile_v1_fused_combos() -> list[dict]:
    out = [dict(PAD_ID=PAD, TILE=tile, REQ_BLOCK=rb, NUM_GROUPS=g, GROUP_BLOCK=next_pow2(g), FAULT=0,
                POS_INT32=p32, POW2=pow2)
           for g in (1, 3, 4) for pow2 in (True, False) for tile, rb, p32 in
           ((NPU_TILES[-1], REQ_BLOCKS[-1], True), (NPU_TILES[0], REQ_BLOCKS[0], False))]
    return out + [dict(out[-1], TILE=t, REQ_BLOCK=rb) for t, rb in TILE_SWEEP]


def _tile_v2_combos() -> list[dict]:
    out = []
    for n in CP_SIZES:
        for i in (INTERLEAVES if n > 1 else (16,)):
            for g in (1, 4):
                for pow2 in (True, False):
                    for tile, rb, p32 in ((NPU_TILES[-1], REQ_BLOCKS[-1], True),) + (
                            ((NPU_TILES[0], REQ_BLOCKS[0], False),) if i == 16 else ()):
                        out.append(dict(CP_SIZE=n, CP_INTERLEAVE=i, PAD_ID=PAD, TRITON_BLOCK_SIZE=tile,
                                        NUM_GROUPS=g, GROUP_BLOCK=next_pow2(g), REQ_BLOCK=rb, FAULT=0,
                                        POS_INT32=p32, POW2=pow2))
    base = next(c for c in out if c["CP_SIZE"] == 8 and c["CP_INTERLEAVE"] == 16 and c["NUM_GROUPS"] == 4)
    return out + [dict(base, TRITON_BLOCK_SIZE=t, REQ_BLOCK=rb) for t, rb in TILE_SWEEP]


_V1_SIG = {"num_tokens": "i32", "max_num_tokens": "i32", "query_start_loc_ptr": "*i32", "positions_ptr": "*i64",
           "block_table_ptr": "*i32", "block_table_stride": "i32", "block_size": "i32", "slot_mapping_ptr": "*i64"}
_V1_FUSED_SIG = {"num_tokens": "i32", "max_num_tokens": "i32", "query_start_loc_ptr": "*i32",
                 "positions_ptr": "*i64", "block_table_ptrs": "*i64", "block_table_strides": "*i64",
                 "block_sizes": "*i32", "is_circular": "*i32", "slot_mapping_ptr": "*i64",
                 "slot_mapping_stride": "i32"}
_V2_SIG = {"num_tokens": "i32", "max_num_tokens": "i32", "idx_mapping": "*i32", "query_start_loc": "*i32",
           "pos": "*i64", "block_table_ptrs": "*i64", "block_table_strides": "*i64", "block_sizes": "*i32",
           "slot_mappings_ptr": "*i64", "slot_mappings_stride": "i32", "cp_rank": "i32",
           "slot_mapping_enabled": "*i32", "group_cp_sizes": "*i32", "is_circular": "*i32"}


def _with(sig: dict, after: str, **extra) -> dict:
    out = {}
    for k, v in sig.items():
        out[k] = v
        if k == after:
            out.update(extra)
    return out


_TILE_V1_SIG = {k: v for k, v in _with(_V1_SIG, "max_num_tokens", num_reqs="i32").items() if k != "block_size"}

# The kernels cpsim launches on an NPU (cpsim.kernels.select.tile_kernels("npu") for the tile design), one entry each.
_MRV2_SIG = {"max_num_tokens": "i32", "idx_mapping": "*i32", "query_start_loc": "*i32", "pos": "*i64",
             "block_table_ptrs": "*i64", "block_table_strides": "*i64", "num_blocks_ptr": "*i32",
             "num_blocks_stride": "i32", "block_sizes": "*i32", "kernel_block_sizes": "*i32",
             "group_cp_sizes": "*i32", "slot_mappings_ptr": "*i64", "slot_mappings_stride": "i32", "cp_rank": "i32",
             "is_padding": "*i1", "is_circular": "*i32", "num_tokens_padded": "i32"}


def _mrv2_combos() -> list[dict]:
    return [dict(CP_SIZE=n, CP_INTERLEAVE=i, PAD_ID=PAD, TRITON_BLOCK_SIZE=PER_REQ_TILE, FAULT=0)
            for n in CP_SIZES for i in (INTERLEAVES if n > 1 else (16,))]


# Replay padding (cpsim/paths/replay_padding.py): after every path's slot mapping, on its int64 [groups, entries] buffer.
_REPLAY_SIG = {"slot_mappings_ptr": "*i64", "group_stride": "i32", "cacheable_groups_ptr": "*i32",
               "query_start_loc_ptr": "*i32", "positions_ptr": "*i64", "replay_start_ptr": "*i32", "window": "i32",
               "pad_slot_id": "i32"}


def _replay_combos() -> list[dict]:
    """NUM_GROUPS: 1 to 4 prefix-cacheable groups (presets have up to 3); BLOCK: the launcher's 1024."""
    return [dict(NUM_GROUPS=n, BLOCK=PER_REQ_TILE, FAULT=0) for n in (1, 2, 3, 4)]


BUILTINS: list[Entry] = [
    Entry("triton_v1", "cpsim.kernels.triton_v1:_compute_slot_mapping_kernel", _V1_SIG, _v1_combos),
    Entry("triton_v1 fused", "cpsim.kernels.triton_v1:_compute_slot_mapping_fused_kernel", _V1_FUSED_SIG,
          _v1_fused_combos),
    Entry("triton_v2", "cpsim.kernels.triton_v2:_compute_slot_mappings_kernel", _V2_SIG, _v2_combos),
    Entry("tile_v1 (npu)", "cpsim.kernels.tile_npu:_tile_slot_mapping_kernel", _TILE_V1_SIG, _tile_v1_combos),
    Entry("tile_v1 fused (npu)", "cpsim.kernels.tile_npu:_tile_slot_mapping_fused_kernel",
          _with(_V1_FUSED_SIG, "max_num_tokens", num_reqs="i32"), _tile_v1_fused_combos),
    Entry("tile_v2 (npu)", "cpsim.kernels.tile_npu:_tile_slot_mappings_kernel",
          _with(_V2_SIG, "max_num_tokens", num_reqs="i32"), _tile_v2_combos),
    Entry("mrv2", "cpsim.kernels.mrv2:_compute_slot_mappings_kernel", _MRV2_SIG, _mrv2_combos),
    Entry("replay_pad", "cpsim.kernels.replay_pad:_pad_replayed_slots_kernel", _REPLAY_SIG, _replay_combos),
]


def builtin_jobs(names: list[str] | None = None) -> list[Job]:
    return [j for e in BUILTINS if not names or e.name in names for j in e.jobs()]


# ---- a user's kernel: runtime argument types and constexpr values per ABI -------------

USER_ARG_TYPES = {
    "num_tokens": "i32", "max_num_tokens": "i32", "query_start_loc_ptr": "*i32", "positions_ptr": "*i64",
    "block_table_ptr": "*i32", "block_table_stride": "i32", "block_size": "i32", "slot_mapping_ptr": "*i32",
    "block_table_addrs_ptr": "*i64", "slot_mapping_addrs_ptr": "*i64", "block_table_strides_ptr": "*i64",
    "block_sizes_ptr": "*i32", "is_circular_ptr": "*i32", "idx_mapping": "*i32", "query_start_loc": "*i32",
    "pos": "*i64", "block_table_ptrs": "*i64", "block_table_strides": "*i64", "block_sizes": "*i32",
    "slot_mappings_ptr": "*i32", "slot_mappings_stride": "i32", "cp_rank": "i32",
    "slot_mapping_enabled": "*i32", "group_cp_sizes": "*i32", "is_circular": "*i32",
}
# vllm-v2 writes int64 slot mappings (adapters.py); ascend ABIs int32; replay kernels pad the int64 buffer.
USER_ARG_TYPES_BY_ABI = {"vllm-v2": {"slot_mappings_ptr": "*i64"},
                         **{abi: dict(_REPLAY_SIG, replay_window="i32") for abi in ("vllm-replay-pad",
                                                                                    "vllm-replay-pad-bits")}}


def user_combos(abi: str, params: set[str]) -> list[dict]:
    """Constexpr values cpsim's adapters pass to a kernel of ``abi`` (only the names it declares)."""
    if abi == "ascend-v1":
        combos = [{k: v for k, v in c.items() if k != "FAULT"} for c in _v1_combos()]
    elif abi == "ascend-v1-fused":
        combos = [dict(PAD_ID=PAD, NUM_REQS=r, TILE_BLOCK_SIZE=PER_REQ_TILE, PARALLEL_TILES=2,
                       BLOCK_TABLE_WINDOW_SIZE=window_size(PER_REQ_TILE, b), HAS_CIRCULAR=hc)
                  for b in _min_entries() for r in (1, 16) for hc in (False, True)]
    elif abi in ("ascend-v2", "vllm-v2"):
        combos = [dict(CP_SIZE=c["CP_SIZE"], CP_INTERLEAVE=c["CP_INTERLEAVE"], PAD_ID=PAD,
                       TRITON_BLOCK_SIZE=PER_REQ_TILE, BLOCK_TABLE_WINDOW_SIZE=c["BLOCK_TABLE_WINDOW_SIZE"],
                       BLOCK_TABLE_PAD_SIZE=next_pow2(4096), HAS_SLOT_MAPPING_ENABLED=True) for c in _v2_combos()]
    elif abi == "vllm-replay-pad":
        combos = [{k: v for k, v in c.items() if k != "FAULT"} for c in _replay_combos()]
    elif abi == "vllm-replay-pad-bits":  # 4 groups, every subset of them prefix-cacheable but none
        combos = [dict(CACHEABLE_GROUPS=m, NUM_GROUPS=4, BLOCK=PER_REQ_TILE) for m in range(1, 16)]
    else:
        raise ValueError(f"no compile combinations for ABI {abi!r}")
    out, seen = [], set()
    for c in combos:
        c = {k: v for k, v in c.items() if k in params}
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out

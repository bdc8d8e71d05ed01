"""Host side of the tile-parallel kernels: launch shape and the constexprs it needs.

The launch shape depends on ``max_num_tokens`` and ``max_num_reqs`` only, never on
the batch, so a captured graph stays valid for every batch of its capture size.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpsim.kernels import next_pow2

INT32_MAX = 2**31 - 1
CPU_TILE = 8192      # the interpreter pays per program: few, large tiles
NPU_TILE = (64, 1024)  # smallest / largest tile on an Ascend NPU (cpsim/ascend_check/registry.py compiles each)
NPU_VECTOR_CORES = 48  # when the driver cannot say (Ascend 910B: 40-48 vector cores)


@dataclass(frozen=True)
class TileLaunch:
    tile: int
    req_block: int
    pos_int32: bool
    num_warps: int
    max_programs: int = 0   # > 0: a persistent grid of at most this many programs (npu)

    def grid(self, max_num_tokens: int) -> tuple[int]:
        tiles = max(-(-max_num_tokens // self.tile), 1)
        return (min(tiles, self.max_programs) if self.max_programs else tiles,)


def npu_vector_cores() -> int:
    """Vector cores of the current NPU, as triton-ascend's driver reports them (vllm-ascend sizes grids so)."""
    try:
        import triton
        return int(triton.runtime.driver.active.utils.get_device_properties("npu")["num_vectorcore"]) \
            or NPU_VECTOR_CORES
    except Exception:  # noqa: BLE001 - grid size only: every tile is still walked by the persistent loop
        return NPU_VECTOR_CORES


def gpu_tile(max_num_tokens: int) -> tuple[int, int]:
    """(tokens per program, warps) on a GPU, from the H200 sweep in docs/BENCHMARKS.md.

    Small buffers are latency-bound: short tiles keep the request search short.
    Large ones want about 2048 programs of at most 512 tokens, 4 warps each.
    """
    if max_num_tokens <= 1024:
        return 64, 4
    tile = min(max(next_pow2(-(-max_num_tokens // 2048)), 32), 512)
    return tile, min(max(tile // 32, 1), 4)


def plan(max_num_tokens: int, max_num_reqs: int, max_model_len: int, device_type: str,
         tile: int | None = None, num_warps: int | None = None) -> TileLaunch:
    """Tile size, request vector size and whether int32 positions are provably safe.

    Positions are below ``max_model_len``; every intermediate of the index math
    (virtual offset, local offset, table index) is at most the position itself,
    so int32 is exact when ``max_model_len <= 2**31 - 1``.
    """
    warps = 4
    programs = 0
    if device_type == "npu":
        tile = tile or min(max(next_pow2(max_num_tokens), NPU_TILE[0]), NPU_TILE[1])
        programs = npu_vector_cores()
    elif tile is None:
        if device_type == "cpu":
            tile = min(next_pow2(max_num_tokens), CPU_TILE)
        else:
            tile, warps = gpu_tile(max_num_tokens)
    return TileLaunch(tile=tile, req_block=next_pow2(max_num_reqs + 1),
                      pos_int32=max_model_len <= INT32_MAX, num_warps=num_warps or warps, max_programs=programs)


def is_pow2(x: int) -> bool:
    return 0 < x < (1 << 24) and x & (x - 1) == 0


def pow2_sizes(block_sizes, cp_size: int = 1) -> bool:
    """Whether the tile kernels may replace divisions by these sizes with shifts."""
    return is_pow2(cp_size) and all(is_pow2(int(b)) for b in block_sizes)

"""The one place that picks kernel modules by device type.

The per-request kernels (``triton_v1``, ``triton_v2``) are one design for every
device. The tile-parallel kernels differ: on a GPU ``tile_v1`` / ``tile_v2``
([groups, tile] blocks, one program per tile); on an Ascend NPU ``tile_npu``
(persistent grid, scalar table pointer per group; see its docstring).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TileKernels:
    v1: Any
    v1_fused: Any
    v2: Any


def tile_kernels(device_type: str) -> TileKernels:
    if device_type == "npu":
        from cpsim.kernels import tile_npu
        return TileKernels(tile_npu._tile_slot_mapping_kernel, tile_npu._tile_slot_mapping_fused_kernel,
                           tile_npu._tile_slot_mappings_kernel)
    from cpsim.kernels import tile_v1, tile_v2
    return TileKernels(tile_v1._tile_slot_mapping_kernel, tile_v1._tile_slot_mapping_fused_kernel,
                       tile_v2._tile_slot_mappings_kernel)

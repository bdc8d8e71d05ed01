"""The ABI table: each calling convention a slot-mapping kernel may take, as plain data (parameter names,
launch, the releases whose host launches it so). :mod:`cpsim.kernels.under_test` applies it to a kernel."""

from __future__ import annotations

from dataclasses import dataclass, replace

from cpsim.releases import abi_releases


@dataclass(frozen=True)
class Abi:
    """A calling convention, as plain data: ``detect`` applies the table to a list of parameter names."""

    name: str
    paths: tuple[str, ...]          # cpsim paths this ABI can stand in for
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()  # passed when the kernel declares them
    one_of: tuple[str, ...] = ()    # exactly one of these must be declared
    launch: str = ""
    releases: str = ""              # the releases whose host code launches a kernel this way
    origin: str = ""                # package whose kernels take this ABI when names alone are ambiguous
    out_dtype: str = "int64"        # the slot buffer the host hands the kernel
    release_range: tuple[str, str] = ()  # (first, last) release of ``releases`` where names alone are ambiguous

    def buffer_dtype(self, chosen: str = "abi") -> str:
        """The slot buffer a kernel of this ABI is handed: ``chosen`` (a scenario's or an explicit batch's
        ``limits.slot_buffer_dtype``) unless it is "abi", else the host's own, ``out_dtype``."""
        return self.out_dtype if chosen == "abi" else chosen

    def describe(self) -> str:
        parts = list(self.required)
        if self.one_of:
            parts.append("one of (" + " | ".join(self.one_of) + ")")
        if self.optional:
            parts.append("optional (" + ", ".join(self.optional) + ")")
        return f"{self.name}: ({', '.join(parts)}); {self.launch}"


REPLAY = "replay"  # the pseudo-path of --kernel-replay: the replay-padding pass every path runs

# What the callable ABI may ask for, by parameter name (one group, one rank).
CALLABLE_INPUTS = {
    "positions": "int64 [num_tokens] positions of the scheduled tokens",
    "query_start_loc": "int32 [num_reqs + 1] token offsets of the requests",
    "req_indices": "int64 [num_tokens] batch index of each token",
    "idx_mapping": "int32 [num_reqs] table row of each batch index (-1 = dummy request)",
    "block_table": "int32 [rows, width] this group's table (v1: kernel-block entries; v2: physical)",
    "block_size": "slots per table entry",
    "kv_block_size": "physical KV block size B",
    "cp_world_size": "ranks this group is sharded over (1 = every rank holds every token)",
    "cp_rank": "this rank's index among them (0 when not sharded)",
    "cp_interleave": "CP KV-cache interleave size",
    "is_circular": "the table is a sliding-window ring (block 0 holds the window)",
    "cp_sharded": "the group is sharded over its CP ranks (upstream `dcp_sharded`; false: replicated)",
    "world_cp_size": "the world CP size N, as the runtime passes it to every group (`CP_SIZE`)",
    "world_cp_rank": "this rank's total CP rank in [0, N)",
    "pad_id": "value for tokens this rank does not store",
    "max_num_tokens": "entries of the slot buffer",
}

# Parameter lists of the released kernels (docs/UPSTREAM_ABIS.md says where each was read).
_VLLM_V1_HEAD = ("num_tokens", "max_num_tokens", "query_start_loc_ptr", "positions_ptr", "block_table_ptr",
                 "block_table_stride")
_VLLM_V1_TAIL = ("TOTAL_CP_WORLD_SIZE", "TOTAL_CP_RANK", "CP_KV_CACHE_INTERLEAVE_SIZE", "PAD_ID", "BLOCK_SIZE")
_MRV2_HEAD = ("max_num_tokens", "idx_mapping", "query_start_loc", "pos", "block_table_ptrs", "block_table_strides",
              "block_sizes")
_MRV2_TAIL = ("slot_mappings_ptr", "slot_mappings_stride", "cp_rank", "CP_SIZE", "CP_INTERLEAVE", "PAD_ID",
              "TRITON_BLOCK_SIZE")

ABIS: dict[str, Abi] = {a.name: a for a in (
    Abi("ascend-v1", ("v1",), (
        "num_tokens", "max_num_tokens", "query_start_loc_ptr", "positions_ptr", "block_table_ptr",
        "block_table_stride", "block_size", "slot_mapping_ptr", "KV_CACHE_BLOCK_SIZE", "BLOCKS_PER_KV_BLOCK",
        "TOTAL_CP_WORLD_SIZE", "TOTAL_CP_RANK", "CP_KV_CACHE_INTERLEAVE_SIZE", "PAD_ID", "TILE_BLOCK_SIZE",
        "BLOCK_TABLE_WINDOW_SIZE"), ("IS_CIRCULAR",),
        launch="grid (num_reqs + 1,), one launch per group, int32 output", out_dtype="int32"),
    Abi("vllm-v1-0.19", ("v1",), _VLLM_V1_HEAD + ("block_size", "slot_mapping_ptr") + _VLLM_V1_TAIL,
        launch="grid (num_reqs + 1,), one launch per slot-mapped group, kernel-block table, block_size = kernel "
               "block b (the virtual block is b x CP), CP = PCP x DCP, num_tokens = scheduled count, int64 output",
        releases="vLLM 0.19-0.25 (_compute_slot_mapping_kernel)", origin="vllm"),
    Abi("vllm-v1-0.26", ("v1",), _VLLM_V1_HEAD + ("block_size", "slot_mapping_ptr", "KV_CACHE_BLOCK_SIZE",
                                                  "BLOCKS_PER_KV_BLOCK") + _VLLM_V1_TAIL,
        launch="grid (num_reqs + 1,), one launch per slot-mapped group (state groups left alone), kernel-block "
               "table, KV_CACHE_BLOCK_SIZE = B, CP = DCP, num_tokens = scheduled count, int64 output",
        releases="vLLM 0.26-0.28 (_compute_slot_mapping_kernel), 0.29-0.31 (ComputeSlotMappingKernel.kernel)",
        origin="vllm"),
    Abi("vllm-v1-0.32", ("v1",), _VLLM_V1_HEAD + ("slot_mapping_ptr", "KV_CACHE_BLOCK_SIZE") + _VLLM_V1_TAIL,
        launch="grid (num_reqs + 1,), one launch per slot-mapped group (state groups left alone), physical "
               "table, KV_CACHE_BLOCK_SIZE = B, CP = DCP, num_tokens = scheduled count, int64 output",
        releases="vLLM 0.32-0.33 (ComputeSlotMappingKernel.kernel)", origin="vllm"),
    Abi("ascend-v1-fused", ("v1-fused",), (
        "num_tokens", "max_num_tokens", "query_start_loc_ptr", "positions_ptr", "block_table_addrs_ptr",
        "slot_mapping_addrs_ptr", "block_table_strides_ptr", "block_sizes_ptr", "PAD_ID", "NUM_REQS",
        "TILE_BLOCK_SIZE", "PARALLEL_TILES", "BLOCK_TABLE_WINDOW_SIZE"), ("is_circular_ptr", "HAS_CIRCULAR"),
        launch="grid (num_groups * (NUM_REQS * PARALLEL_TILES + 1),), int32 outputs", out_dtype="int32"),
    Abi("ascend-v1-fused-adaptive", ("v1-fused",), (
        "num_tokens", "max_num_tokens", "query_start_loc_ptr", "positions_ptr", "block_table_addrs_ptr",
        "slot_mapping_addrs_ptr", "block_table_strides_ptr", "block_sizes_ptr", "PAD_ID", "NUM_REQS",
        "SMALL_TILE_BLOCK_SIZE", "SMALL_BLOCK_TABLE_WINDOW_SIZE", "LARGE_BLOCK_TABLE_WINDOW_SIZE"),
        ("is_circular_ptr", "HAS_CIRCULAR"),
        launch="grid (num_groups * (NUM_REQS + 1),), small tiles for short requests, 1024 for long ones, "
               "int32 outputs", out_dtype="int32"),
    Abi("ascend-v2", ("v2",), _MRV2_HEAD + _MRV2_TAIL, ("slot_mapping_enabled", "HAS_SLOT_MAPPING_ENABLED"),
        ("BLOCK_TABLE_PAD_SIZE", "BLOCK_TABLE_WINDOW_SIZE"),
        launch="grid (num_groups, num_reqs + 1), int32 output", origin="vllm_ascend", out_dtype="int32"),
    Abi("ascend-v2-0.18", ("v2",), _MRV2_HEAD + _MRV2_TAIL + ("TOTAL_BLOCK_SIZE",),
        launch="grid (num_groups, num_reqs + 1), one launch for every group with CP_SIZE = the world CP size, "
               "physical tables, TOTAL_BLOCK_SIZE = 4096, int32 output",
        releases="vllm-ascend 0.18.0 (worker/v2/block_table.py)", origin="vllm_ascend",
        out_dtype="int32", release_range=("0.18.0", "0.22.99")),
    Abi("ascend-v2-0.23", ("v2",), _MRV2_HEAD + _MRV2_TAIL + ("TOTAL_BLOCK_SIZE",),
        launch="grid (num_groups, num_reqs + 1), one launch for every group with CP_SIZE = the world CP size, "
               "kernel-block tables, block_sizes = the kernel block b, TOTAL_BLOCK_SIZE = 4096, int32 output",
        releases="vllm-ascend 0.23.0, 0.23.0.post1 (worker/v2/block_table.py)", origin="vllm_ascend",
        out_dtype="int32", release_range=("0.23.0", "0.23.99")),
    Abi("vllm-v2", ("v2",), ("num_tokens",) + _MRV2_HEAD + _MRV2_TAIL,
        launch="grid (num_groups, num_reqs + 1), num_tokens = the graph-padded count, physical tables, int64 output",
        releases="vLLM 0.17.0 (v1/worker/gpu/block_table.py)"),
    Abi("vllm-mrv2-0.18", ("v2",), _MRV2_HEAD + _MRV2_TAIL,
        launch="grid (num_groups, num_reqs + 1), one launch for every group with CP_SIZE = the world CP size "
               "(--kernel-v2-launch split: one per group CP size), physical tables, int64 output",
        releases="vLLM 0.18-0.21 (v1/worker/gpu/block_table.py)", origin="vllm", release_range=("0.18.0", "0.21.99")),
    Abi("vllm-mrv2-0.22", ("v2",), _MRV2_HEAD + _MRV2_TAIL,
        launch="grid (num_groups, num_reqs + 1), one launch for every group with CP_SIZE = the world CP size "
               "(--kernel-v2-launch split: one per group CP size), kernel-block tables, block_sizes = the kernel "
               "block b, int64 output",
        releases="vLLM 0.22-0.28 (v1/worker/gpu/block_table.py)", origin="vllm", release_range=("0.22.0", "0.28.99")),
    Abi("vllm-mrv2-0.29", ("v2",), _MRV2_HEAD + ("kernel_block_sizes", "slot_mapping_enabled") + _MRV2_TAIL,
        launch="grid (num_groups, num_reqs + 1), one launch for every group with CP_SIZE = the world CP size, "
               "kernel-block tables, per-group slot_mapping_enabled, int64 output",
        releases="vLLM 0.29-0.30", origin="vllm"),
    Abi("vllm-mrv2-0.31", ("v2",), _MRV2_HEAD + ("kernel_block_sizes", "slot_mapping_enabled", "dcp_sharded")
        + _MRV2_TAIL,
        launch="grid (num_groups, num_reqs + 1), one launch for every group with CP_SIZE = the world CP size, "
               "kernel-block tables, per-group slot_mapping_enabled and dcp_sharded, int64 output",
        releases="vLLM 0.31", origin="vllm"),
    Abi("vllm-mrv2-0.32", ("v2",), _MRV2_HEAD + ("slot_mapping_enabled", "dcp_sharded") + _MRV2_TAIL,
        launch="grid (num_groups, num_reqs + 1), one launch for every group with CP_SIZE = the world CP size, "
               "physical tables, per-group slot_mapping_enabled and dcp_sharded, int64 output",
        releases="vLLM 0.32-0.33", origin="vllm"),
    Abi("cpsim-mrv2", ("v2",), (
        "max_num_tokens", "idx_mapping", "query_start_loc", "pos", "block_table_ptrs", "block_table_strides",
        "num_blocks_ptr", "num_blocks_stride", "block_sizes", "kernel_block_sizes", "group_cp_sizes",
        "slot_mappings_ptr", "slot_mappings_stride", "cp_rank", "CP_SIZE", "CP_INTERLEAVE", "PAD_ID",
        "TRITON_BLOCK_SIZE"), ("is_padding", "is_circular"),
        launch="grid (num_groups, num_reqs + 1), one launch for every group with its own CP size, "
               "kernel-block tables, int64 output (cpsim's own MRV2 model; no release has it)", origin="cpsim"),
    Abi("callable", ("v1", "v1-fused", "v2"), (), tuple(CALLABLE_INPUTS),
        launch="called once per group and rank; returns the group's slots (1-D integer tensor)"),
    # Prefix-cache replay padding (--kernel-replay), run after every path's slot-mapping kernels.
    Abi("vllm-replay-pad", (REPLAY,), (
        "slot_mappings_ptr", "group_stride", "cacheable_groups_ptr", "query_start_loc_ptr", "positions_ptr",
        "replay_start_ptr", "pad_slot_id", "NUM_GROUPS", "BLOCK"), one_of=("window", "replay_window"),
        launch="grid (num_reqs,), after the path's slot-mapping kernels, on its int64 [groups, entries] buffer; "
               "cacheable_groups lists the prefix-cacheable groups (NUM_GROUPS of them)"),
    Abi("vllm-replay-pad-bits", (REPLAY,), (
        "slot_mappings_ptr", "group_stride", "query_start_loc_ptr", "positions_ptr", "replay_start_ptr",
        "pad_slot_id", "CACHEABLE_GROUPS", "NUM_GROUPS", "BLOCK"), one_of=("window", "replay_window"),
        launch="grid (num_reqs,), as vllm-replay-pad; bit g of CACHEABLE_GROUPS set: group g is prefix-cacheable "
               "(NUM_GROUPS = every group)"),
)}
# The releases line of each released ABI is the release table's (cpsim/releases/*.json); a line written
# here stands only for an ABI of a release the table does not list (vllm-v2: vLLM 0.17.0).
ABIS = {n: replace(a, releases=abi_releases(n) or a.releases) for n, a in ABIS.items()}
# ABI names that no longer load, and why (exit 2 with this line).
RETIRED_ABIS = {
    "vllm-mrv2": "vllm-mrv2 matched no vLLM release (num_blocks_ptr and group_cp_sizes are cpsim's own MRV2 "
                 "model); it is now named cpsim-mrv2. Released MRV2 ABIs: vllm-mrv2-0.18, vllm-mrv2-0.29, "
                 "vllm-mrv2-0.31, vllm-mrv2-0.32",
}
REPLAY_ABIS = tuple(n for n, a in ABIS.items() if REPLAY in a.paths)

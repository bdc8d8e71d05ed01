"""Launch arguments the adapters share: the small tensors, dtypes and notes every ABI's launch is built from."""

from __future__ import annotations

import dataclasses

import torch

from cpsim.kernels.under_test import ABIS
from cpsim.paths import v2
from cpsim.paths.prep import PerRank, TableShape
from cpsim.paths.types import Knobs
from cpsim.scenario import INT32_MAX, KVGroup, Scenario

TILE = 1024
ASCEND_TOTAL_BLOCK_SIZE = 4096  # vllm-ascend 0.18-0.23 AscendBlockTables.compute_slot_mappings passes this


def _i32(values, device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int32, device=device)


def _i64(values, device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64, device=device)


def _ptr_dtype(device: torch.device) -> torch.dtype:
    # vLLM keeps pointer tables as uint64; torch_npu lacks uint64 tensors, so NPU gets int64 (same bits).
    return torch.uint64 if device.type in ("cpu", "cuda") else torch.int64


def _check_int32(k, s: Scenario, g: KVGroup) -> None:
    top = g.num_blocks * g.block_size - 1
    if top > INT32_MAX and _out_dtype(k, s) == torch.int32:
        k.note(f"group {g.name}: slots reach {top} but the {k.abi} kernel is handed an int32 slot buffer; slots "
               f"past 2^31-1 cannot be represented (they come back wrapped and are reported as violations)")


def _skip_circular(k, g: KVGroup) -> None:
    k.note(f"group {g.name}: a sliding-window ring table has no flag in this {k.abi} kernel; group not checked")


def _out_dtype(k, s: Scenario) -> torch.dtype:
    """The slot buffer's dtype: the scenario's ``limits.slot_buffer_dtype``, or by default the ABI's (its
    host's: vLLM allocates int64, vllm-ascend int32). Triton casts the kernel's stores to it, so a kernel
    that assumes the other one is judged on what its host would read back."""
    return torch.int32 if ABIS[k.abi].buffer_dtype(s.limits.slot_buffer_dtype) == "int32" else torch.int64


def _physical(s: Scenario, g: KVGroup, alloc, knobs: Knobs, prep: PerRank, k=None) -> tuple[torch.Tensor, int]:
    """(v2's table of group ``g``, slots per entry); with ``k``, as wide as ``k``'s release makes it."""
    shape = v2.table_shape(s, g, knobs)
    if k is not None:
        shape = release_shape(k, s, g, shape)
    return prep.table(alloc, shape), shape.entry_size


def _note_dcp_only(k, s: Scenario) -> None:
    if s.cp.pcp > 1:
        k.note(f"the releases of the {k.abi} ABI shard KV over DCP only: the kernel was handed the DCP size "
               f"{s.cp.dcp} and the DCP rank, as their host does (PCP {s.cp.pcp} does not shard KV; the vLLM "
               f"profiles judge ownership over DCP, cpsim's profile over N = PCP x DCP = {s.cp.world})")


# Released ABIs whose host sizes the slot buffer at max_num_batched_tokens, with no MTP draft reserve (the
# scheduler keeps drafts inside that budget): vLLM 0.23.0-0.33.0 ``BlockTable.slot_mapping``
# (vllm/v1/worker/block_table.py) and ``BlockTables.slot_mappings`` (vllm/v1/worker/gpu/block_table.py);
# vllm-ascend 0.18.0 / 0.23.0.post1 ``AscendBlockTables.slot_mappings`` (vllm_ascend/worker/v2/block_table.py).
# The kernel gets that length as ``max_num_tokens`` and pads up to it. cpsim's own ABIs keep cpsim's buffer
# (``Limits.slot_buffer_size``: the budget plus the draft slots), and so does ``vllm-v2`` (vLLM 0.17.0 sizes
# its buffer at the budget too, but has no release profile: cpsim's, which it is judged by, wants the reserve).
BUDGET_BUFFER = ("vllm-v1-0.19", "vllm-v1-0.26", "vllm-v1-0.32", "vllm-mrv2-0.18", "vllm-mrv2-0.22",
                 "vllm-mrv2-0.29", "vllm-mrv2-0.31", "vllm-mrv2-0.32", "ascend-v2-0.18",
                 "ascend-v2-0.23")


def slot_entries(k, s: Scenario, knobs: Knobs, path: str) -> int:
    """Slot-buffer entries ``k``'s launch is handed on ``path``: its release's buffer for a released ABI
    (``BUDGET_BUFFER``), else cpsim's (or the fault's / the plugged-in sizing's, which always win). A batch
    past the release's budget (which its scheduler never forms) widens the buffer to the batch, with a
    note, so every token is still judged."""
    if k.abi not in BUDGET_BUFFER or knobs.buffer_size or knobs.host_sizing:
        return knobs.buffer_entries(s, path)
    budget = s.limits.max_num_batched_tokens
    need = max(s.batch.num_tokens, s.batch.num_tokens_padded)
    if need > budget:
        k.note(f"the {k.abi} releases size the slot buffer at max_num_batched_tokens ({budget}) and never schedule "
               f"past it; this batch writes {need} entries, so the buffer handed the kernel holds {need}")
    return max(budget, need)


def state_width(abi: str, s: Scenario, g: KVGroup) -> int | None:
    """Table entries a released MRV2 host gives a state (mamba) group, read from its runner
    (gpu/model_runner.py, the loop before ``BlockTables(...)``; ``MambaSpec`` in the align cache mode,
    prefix caching on, ``num_speculative_blocks`` = the MTP draft count), or None (cpsim's width):
    vLLM 0.27-0.28 (``vllm-mrv2-0.22``) cdiv(max_model_len, B x DCP) + the draft blocks, unaligned
    (0.22-0.26 first round cdiv(...) up to 128 // B entries for B <= 128: the same where that divides, and
    the ABI cannot tell the two apart); 0.29-0.33 ``MambaSpec.max_num_blocks_per_req``: cdiv(max_model_len,
    B) + the draft blocks (no CP scaling, no alignment); vllm-ascend 0.23.0.post1 (``ascend-v2-0.23``, built by
    vLLM 0.23.0's runner) cdiv(max_model_len, B x DCP) rounded up to 128 // B entries for B <= 128, + the
    draft blocks."""
    if g.slot_mapped or g.circular:
        return None
    mml, drafts = s.limits.max_model_len, s.limits.num_speculative_tokens
    if abi == "vllm-mrv2-0.22":
        return -(-mml // (g.block_size * s.cp.dcp)) + drafts
    if abi == "ascend-v2-0.23":  # vLLM 0.23.0's runner builds AscendBlockTables: cdiv rounded, then + drafts
        n = -(-mml // (g.block_size * s.cp.dcp))
        step = 128 // g.block_size if g.block_size <= 128 else 1
        return -(-n // step) * step + drafts
    if abi in ("vllm-mrv2-0.29", "vllm-mrv2-0.31", "vllm-mrv2-0.32"):
        return -(-mml // g.block_size) + drafts
    return None


def release_shape(k, s: Scenario, g: KVGroup, shape: TableShape) -> TableShape:
    """``shape`` with the width ``k``'s release gives group ``g`` (:func:`state_width`), where it has its own."""
    width = state_width(k.abi, s, g)
    return shape if width is None else dataclasses.replace(shape, width=width)


def v1_state_launch(abi: str, g: KVGroup) -> bool:
    """Whether the release's v1 host launches the kernel for a state (mamba) group too: vLLM 0.19-0.25's
    ``MultiGroupBlockTable.compute_slot_mapping`` launches every group (``slot_mapping_modes``, which
    leaves state groups out, arrives in 0.26)."""
    return abi == "vllm-v1-0.19" and not g.slot_mapped and not g.circular


def v1_state_width(s: Scenario, g: KVGroup) -> int:
    """The v1 table entries vLLM 0.21-0.25 give a state group: the runner's cdiv(max_model_len, B x CP) +
    the draft blocks (``may_reinitialize_input_batch``, prefix caching on), then ``MultiGroupBlockTable``
    rounds up to 128 // B entries for B <= 128 (0.19-0.20 do not round: the same where that divides)."""
    n = -(-s.limits.max_model_len // (g.block_size * s.cp.world)) + s.limits.num_speculative_tokens
    step = 128 // g.block_size if g.block_size <= 128 else 1
    return -(-n // step) * step

"""Host sizing: how wide each group's block table is and how long the slot buffer is.

Released hosts size these in their block-table constructors (vLLM 0.33.0
``vllm/v1/worker/block_table.py`` ``MultiGroupBlockTable`` and ``get_block_table_width``,
``vllm/v1/worker/gpu/block_table.py`` ``BlockTables`` with the widths its runner computes;
vllm-ascend 0.23.0.post1 ``vllm_ascend/worker/block_table.py``), and two of the bugs
upstream shipped live there: a mamba width divided by CP (vllm-ascend #9724) and a slot
buffer without the MTP draft reserve (vllm-ascend #14024). ``--sizing SPEC`` plugs in a
function of that arithmetic so that ``block-sizing`` and ``capacity`` judge it.

The ABI is plain data in and out (docs/KERNEL_REFERENCE.md, "Host sizing ABI"):
``sizing(host: dict) -> {"table_widths": [int per group], "slot_buffer_len": int}`` with
``host`` as :func:`host_input` builds it. Widths count KV (physical) blocks per row — the
``max_num_blocks_per_req`` a constructor ends with; cpsim multiplies by B/b where its path
holds kernel-block entries, as the constructors do. This module holds the built-in release
functions and cpsim's own (the one its paths use when no ``--sizing`` is given); a user's
function never runs here (``cpsim.run.host_sizer`` runs it in a child process).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Callable

from cpsim.layout import cdiv
from cpsim.scenario import KVGroup, Scenario

ALIGN_TOKENS = 128  # vLLM >= 0.27 get_block_table_width: widths rounded up to 128 tokens
KINDS = {"attention": "attention", "mamba": "mamba", "sliding_window": "circular"}
RESULT_KEYS = ("table_widths", "slot_buffer_len")
OVERSIZE = 4  # a width or buffer past OVERSIZE x the largest rule (+ slack) is garbage: no host allocates it


@dataclass(frozen=True)
class HostSizing:
    """What a sizing function answered for one host (``v1``: MultiGroupBlockTable, ``v2``: BlockTables)."""

    host: str
    table_widths: tuple[int, ...]   # KV blocks per row, per group
    slot_buffer_len: int
    source: str = ""                # the SPEC it came from (reports)


def host_of(path: str) -> str:
    """The host class a path models: every v1 path shares MultiGroupBlockTable's sizing."""
    return "v2" if path == "v2" else "v1"


def host_input(s: Scenario, host: str) -> dict:
    """The plain data a sizing function is handed for ``host`` ("v1" / "v2")."""
    lim, cp = s.limits, s.cp
    return {
        "host": host,
        "max_model_len": lim.max_model_len, "max_num_reqs": lim.max_num_reqs,
        "max_num_batched_tokens": lim.max_num_batched_tokens,
        "num_speculative_tokens": lim.num_speculative_tokens,
        "dcp_world_size": cp.dcp, "pcp_world_size": cp.pcp, "cp_kv_cache_interleave_size": cp.interleave,
        "groups": [{"name": g.name, "kind": KINDS[g.kind], "block_size": g.block_size,
                    "kernel_block_size": g.b, "cp_size": g.world(cp), "cp_sharded": g.world(cp) > 1}
                   for g in s.groups],
    }


# ---- the arithmetic ------------------------------------------------------------

def block_table_width(num_blocks: int, block_size: int, token_alignment: int | None = ALIGN_TOKENS) -> int:
    """vLLM's ``get_block_table_width``: ``num_blocks`` rounded up to a multiple of
    ``token_alignment / gcd(token_alignment, B)`` blocks (None: unaligned)."""
    if token_alignment is None:
        return num_blocks
    step = token_alignment // gcd(token_alignment, block_size)
    return cdiv(num_blocks, step) * step


def cpsim_width(host: str, max_model_len: int, block_size: int, group_cp: int, cp_world: int) -> int:
    """cpsim's own tables. v1 (vllm-ascend's constructor): the runner hands every group
    ``cdiv(max_model_len, B x N)``; a sharded group divides by its own CP size ``g`` instead and an
    unsharded one (replicated attention, mamba, ring) scales back by N. v2: ``cdiv(max_model_len, B x g)``."""
    if host == "v2" or group_cp > 1:
        return cdiv(max_model_len, block_size * group_cp)
    return cdiv(max_model_len, block_size * cp_world) * cp_world


def scheduled_plus_drafts(h: dict) -> int:
    """Scheduled tokens plus vllm-ascend's MTP draft reserve: ``(num_speculative_tokens - 1) x max_num_reqs``."""
    return h["max_num_batched_tokens"] + max(h["num_speculative_tokens"] - 1, 0) * h["max_num_reqs"]


def cpsim_sizing(h: dict) -> dict:
    world = h["dcp_world_size"] * h["pcp_world_size"]
    return {"table_widths": [cpsim_width(h["host"], h["max_model_len"], g["block_size"], g["cp_size"], world)
                             for g in h["groups"]],
            "slot_buffer_len": scheduled_plus_drafts(h)}


def vllm_0_33_width(h: dict, g: dict) -> int:
    """vLLM 0.33.0: the spec's ``max_num_blocks_per_req`` (kv_cache_interface.py) then
    ``get_block_table_width``. Attention: ``cdiv(max_len, B x DCP)`` if DCP-sharded, else
    ``cdiv(max_len, B)``; a circular buffer 1; mamba in align mode ``cdiv(max_len, B) +
    num_speculative_blocks`` (state is never CP-sharded). v1 (MultiGroupBlockTable) aligns every
    slot-mapped group to 128 tokens and leaves mamba (SlotMappingMode.NONE) unaligned; v2 (the MRV2
    runner) aligns by the spec's ``block_table_token_alignment``: 128 for attention, none otherwise."""
    mml, B = h["max_model_len"], g["block_size"]
    if g["kind"] == "mamba":
        n = cdiv(mml, B) + h["num_speculative_tokens"]
    elif g["kind"] == "circular":
        n = 1
    else:
        n = cdiv(mml, B * (h["dcp_world_size"] if g["cp_sharded"] else 1))
    aligned = g["kind"] == "attention" or (h["host"] == "v1" and g["kind"] != "mamba")
    return block_table_width(n, B, ALIGN_TOKENS if aligned else None)


def vllm_0_33(h: dict) -> dict:
    """vLLM 0.33.0: both hosts' slot buffers hold ``max_num_batched_tokens`` entries (BlockTable's
    ``slot_mapping``, BlockTables' ``slot_mappings``); drafts are mapped a step at a time inside it."""
    return {"table_widths": [vllm_0_33_width(h, g) for g in h["groups"]],
            "slot_buffer_len": h["max_num_batched_tokens"]}


def ascend_0_23_width(h: dict, g: dict, mamba_times_cp: bool = True, per_group_cp: bool = False) -> int:
    """vllm-ascend 0.23.0.post1 v1 (model_runner_v1.py, then BlockTable's constructor): every group
    ``cdiv(max_model_len, B x PCP x DCP)``; a mamba group adds ``num_speculative_blocks`` and is then
    multiplied by PCP x DCP (its state is not sharded; ``mamba_times_cp`` off is vllm-ascend #9724).
    ``per_group_cp``: an attention group divides by its own CP size instead (cpsim's per-group CP
    model; the release has one CP size for every group, so a replicated group's table is too narrow)."""
    mml, B, nsb = h["max_model_len"], g["block_size"], h["num_speculative_tokens"]
    world = h["dcp_world_size"] * h["pcp_world_size"]
    if g["kind"] != "mamba":
        return max(cdiv(mml, B * (g["cp_size"] if per_group_cp else world)), 1)
    n = cdiv(mml, B * world) + nsb
    return n * world if world > 1 and mamba_times_cp else n


def ascend_0_23_buffer(h: dict, draft_reserve: bool = True) -> int:
    """vllm-ascend 0.23.0.post1 v1 BlockTable: ``max_num_batched_tokens + 2 x PCP x max_num_reqs`` plus
    the MTP draft reserve ``(num_speculative_tokens - 1) x max_num_reqs`` (``draft_reserve`` off is
    vllm-ascend #14024)."""
    reserve = scheduled_plus_drafts(h) - h["max_num_batched_tokens"] if draft_reserve else 0
    return h["max_num_batched_tokens"] + 2 * h["pcp_world_size"] * h["max_num_reqs"] + reserve


def vllm_ascend_0_23(h: dict) -> dict:
    return {"table_widths": [ascend_0_23_width(h, g) for g in h["groups"]],
            "slot_buffer_len": ascend_0_23_buffer(h)}


BUILTIN: dict[str, Callable[[dict], dict]] = {
    "cpsim": cpsim_sizing, "vllm-0.33": vllm_0_33, "vllm-ascend-0.23": vllm_ascend_0_23}
# The hosts a built-in was read for. vllm-ascend 0.23.0.post1 sizes only its v1 MultiGroupBlockTable:
# its v2 path takes vLLM's MRV2 runner and BlockTables (AscendBlockTables subclasses it, unconstructed in
# the sdist), so cpsim's own sizing stands there, with a note.
BUILTIN_HOSTS = {"vllm-ascend-0.23": ("v1",)}


# ---- reading an answer -------------------------------------------------------------

def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_answer(answer, h: dict, source: str) -> HostSizing:
    """A sizing function's answer as a HostSizing; ValueError saying what is wrong with it (garbage)."""
    if not isinstance(answer, dict) or set(answer) != set(RESULT_KEYS):
        got = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
        raise ValueError(f"returned {got}; the ABI wants a dict with exactly {', '.join(RESULT_KEYS)}")
    widths, buf = answer["table_widths"], answer["slot_buffer_len"]
    groups = h["groups"]
    if not isinstance(widths, (list, tuple)) or len(widths) != len(groups) or not all(_is_int(w) for w in widths):
        raise ValueError(f"table_widths must be a list of {len(groups)} ints (one per group), got {widths!r:.120}")
    if not _is_int(buf):
        raise ValueError(f"slot_buffer_len must be an int, got {buf!r:.80}")
    for w, g in zip(widths, groups):
        cap = OVERSIZE * cdiv(h["max_model_len"], g["block_size"]) + 4096
        if not 1 <= w <= cap:
            raise ValueError(f"table width {w} for group {g['name']} lies outside [1, {cap}] (no host allocates it)")
    cap = OVERSIZE * (scheduled_plus_drafts(h) + 2 * h["pcp_world_size"] * h["max_num_reqs"]) + 4096
    if not 1 <= buf <= cap:
        raise ValueError(f"slot_buffer_len {buf} lies outside [1, {cap}] (no host allocates it)")
    return HostSizing(h["host"], tuple(int(w) for w in widths), int(buf), source)


def sized_width(sizing: tuple[HostSizing, ...], path: str, s: Scenario, g: KVGroup) -> int | None:
    """Group ``g``'s width the plugged-in sizing gave ``path``'s host; None: none given. A tail group
    (``row_blocks``) keeps its row's width: it is cpsim's model of an unreleased spec (vLLM's
    KpoolTailSpec) that no release's sizing knows, so the answer for it is not used."""
    if g.row_blocks:
        return None
    for hs in sizing:
        if hs.host == host_of(path):
            return hs.table_widths[next(i for i, x in enumerate(s.groups) if x is g)]
    return None


def sized_buffer(sizing: tuple[HostSizing, ...], path: str) -> int | None:
    for hs in sizing:
        if hs.host == host_of(path):
            return hs.slot_buffer_len
    return None

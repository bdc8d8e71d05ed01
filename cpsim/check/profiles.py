"""Release profiles: what legitimately differs between the runtimes the oracle judges.

The universal invariants (one owner, owner rule, dense local slots, no collision,
bounds, inputs) hold under every profile. A profile fixes the rest — the host
contract a release ships — so a released kernel is judged by its own release and
not by cpsim's model. Pure data and pure functions; each profile names the release
files it was read from (docs/UPSTREAM_ABIS.md, docs/SPEC.md §4 "Profiles"); which releases each
profile judges is the release table's (:mod:`cpsim.releases`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import gcd

from cpsim import releases
from cpsim.errors import ConfigError
from cpsim.layout import cdiv
from cpsim.scenario import cp_layout_error, max_blocks_needed

ALIGN_TOKENS = 128  # vLLM >= 0.27 `get_block_table_width`: widths rounded up to a 128-token multiple


@dataclass(frozen=True)
class Profile:
    name: str
    releases: str               # the releases this contract was read from
    sources: tuple[str, ...]    # release files (paths inside the wheel / sdist)
    width_rule: str             # "exact": cdiv(max_model_len, B x g) entries; "aligned-128": at least the
                                # spec's entries, rounded up to 128 tokens; "at-least": the spec's entries or more
    state_groups: str           # mamba / state groups: "pad" (every entry PAD), "untouched" (left as they were),
                                # on MRV2 "slots" (mapped unsharded, dcp_sharded false) or "slots-sharded"
                                # (mapped over DCP like every group: 0.29-0.30 have no dcp_sharded)
    state_width: str            # "per-token": cdiv(max_model_len, B) entries; "spec": 1 + speculative blocks
    padding_reach: str          # "buffer": PAD to the end of the buffer; "padded-count": up to the padded count
    pcp_shards_kv: bool         # KV sharded over PCP x DCP (vllm-ascend) or over DCP only (vLLM)
    group_layouts: tuple[str, ...]  # "sharded", "replicated", "partial-replica"
    ring_windows: bool          # a sliding-window group may be a ring buffer (1 block, slot = p % window)
    circular_pad: bool = False  # MRV2 launches a ring (CircularBufferSpec) with slot_mapping_enabled false: all PAD
    shards_attention: bool = False  # no per-group CP flag: the release shards every attention group over its KV world,
                                    # so a group in a layout it lacks is laid out sharded (not refused)


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("cpsim", "cpsim's own model (vllm-ascend's CP layout with vLLM main's per-group CP sizes)",
            ("docs/SPEC.md",), "exact", "pad", "per-token", "buffer", True,
            ("sharded", "replicated", "partial-replica"), True),
    Profile("vllm-0.25", releases.profile_releases("vllm-0.25"),
            ("vllm/v1/worker/block_table.py (compute_slot_mapping: total_cp_world_size = PCP x DCP)",),
            "at-least", "untouched", "spec", "buffer", True, ("sharded",), False, shards_attention=True),
    Profile("vllm-0.26", releases.profile_releases("vllm-0.26"),
            ("vllm/v1/worker/block_table.py", "vllm/v1/worker/gpu/block_table.py"),
            "at-least", "untouched", "spec", "buffer", False, ("sharded",), False, shards_attention=True),
    Profile("vllm-0.30", releases.profile_releases("vllm-0.30"),
            ("vllm/v1/worker/gpu/model_runner.py (slot_mapping_enabled: every group but CircularBufferSpec)",
             "vllm/v1/worker/gpu/block_table.py (CP_SIZE = dcp_size for every group, no dcp_sharded)"),
            "aligned-128", "slots-sharded", "spec", "buffer", False, ("sharded", "replicated"), False, True,
            shards_attention=True),
    Profile("vllm-0.31", releases.profile_releases("vllm-0.31"),
            ("vllm/v1/worker/block_table.py (MultiGroupBlockTable, get_block_table_width)",
             "vllm/v1/worker/gpu/block_table.py"),
            "aligned-128", "slots", "spec", "buffer", False, ("sharded", "replicated"), False, True),
    Profile("vllm-0.33", releases.profile_releases("vllm-0.33"),
            ("vllm/v1/worker/block_table.py (get_block_table_width)",
             "vllm/v1/kv_cache_interface.py (max_num_blocks_per_req, uses_slot_mapping)",
             "vllm/v1/worker/gpu/block_table.py (slot_mapping_enabled, dcp_sharded)"),
            "aligned-128", "slots", "spec", "buffer", False, ("sharded", "replicated"), False, True),
    Profile("vllm-ascend-0.23", releases.profile_releases("vllm-ascend-0.23"),
            ("vllm_ascend/worker/block_table.py (_compute_pcp_dcp_slot_mapping)",
             "vllm_ascend/worker/v2/block_table.py (AscendBlockTables)"),
            "at-least", "untouched", "per-token", "padded-count", True, ("sharded", "replicated"), False),
)}

# The profile each released ABI is judged by: the release table's (cpsim/releases/*.json, each path's
# "profile"); cpsim's own ABIs (ascend-v1, ascend-v2, vllm-v2, cpsim-mrv2, callable, builtin) are cpsim's model.
ABI_PROFILE = releases.abi_profiles()


def get(name: str) -> Profile:
    """The named profile; ConfigError (exit 2) naming the known ones."""
    if name not in PROFILES:
        raise ConfigError("--profile", f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]


def for_abis(abis) -> Profile:
    """The profile a run's kernels imply: the released ABI's release family, else cpsim.

    Kernels of two different release families in one run are judged by cpsim's model
    (name ``--profile`` to choose)."""
    names = {ABI_PROFILE[a] for a in abis if a in ABI_PROFILE}
    return PROFILES[names.pop()] if len(names) == 1 else PROFILES["cpsim"]


def aligned_width(entries: int, block_size: int) -> int:
    """vLLM's ``get_block_table_width``: ``entries`` rounded up to a multiple of 128 / gcd(128, B) blocks."""
    step = ALIGN_TOKENS // gcd(ALIGN_TOKENS, block_size)
    return cdiv(entries, step) * step


def state_entries(p: Profile, max_model_len: int, block_size: int, num_speculative: int) -> int:
    """Table entries a mamba / state group needs: per token (cpsim, vllm-ascend), or vLLM 0.33.0's
    ``MambaSpec.max_num_blocks_per_req`` outside align mode, ``1 + num_speculative_blocks``."""
    if p.state_width == "spec":
        return 1 + max(num_speculative, 0)
    return cdiv(max_model_len, block_size)


# Whether the host reserves MTP draft slots past max_num_batched_tokens in the slot buffer (capacity).
# vllm-ascend 0.23.0.post1 vllm_ascend/worker/block_table.py (BlockTable: num_mtp_draft_slots =
# (num_speculative_tokens - 1) x max_num_reqs) and cpsim: yes. vLLM 0.18-0.33 (vllm/v1/worker/block_table.py
# BlockTable.slot_mapping, vllm/v1/worker/gpu/block_table.py BlockTables.slot_mappings): max_num_batched_tokens
# entries; the scheduler keeps drafts inside that budget and a draft step maps at most max_num_reqs tokens.
DRAFT_RESERVE = {"cpsim": True, "vllm-0.25": False, "vllm-0.26": False, "vllm-0.30": False, "vllm-0.31": False,
                 "vllm-0.33": False, "vllm-ascend-0.23": True}


# The one path family whose host has the reserve, where a profile's hosts differ: vllm-ascend 0.18.0 /
# 0.23.0.post1 AscendBlockTables (vllm_ascend/worker/v2/block_table.py, MRV2) allocates max_num_batched_tokens
# entries, only the v1 BlockTable adds the draft slots.
RESERVE_FAMILY = {"vllm-ascend-0.23": "v1"}


def draft_reserve(p: Profile, path: str = "v1") -> bool:
    """Whether the profile's host for ``path`` reserves MTP draft slots past max_num_batched_tokens."""
    only = RESERVE_FAMILY.get(p.name)
    return DRAFT_RESERVE.get(p.name, True) and (only is None or family(path) == only)


def slot_buffer_need(p: Profile, limits, path: str = "v1") -> int:
    """Slot-buffer entries the profile's host must hold: scheduled tokens, plus the draft reserve where it has one."""
    if draft_reserve(p, path):
        return limits.slot_buffer_size
    return limits.max_num_batched_tokens


# ---- the rules a profile applies to a scenario and to the judging of a group ----

def family(path: str) -> str:
    """``"v1"`` for the v1 paths (one launch per group), ``"v2"`` for the MRV2 path."""
    return "v1" if path.removeprefix("rerun-").startswith("v1") else "v2"


def kv_world(s, p: Profile) -> int:
    """Ranks KV is sharded over: PCP x DCP where PCP shards KV (cpsim, vllm-ascend, vLLM 0.19-0.25 v1),
    else DCP only (vLLM >= 0.26 v1 and every MRV2 release pass ``dcp_size`` / ``dcp_rank``)."""
    return s.cp.world if p.pcp_shards_kv else s.cp.dcp


def layout_of(s, p: Profile, g) -> str:
    """``"sharded"``, ``"replicated"`` or ``"partial-replica"``: group ``g``'s layout in the profile's terms.

    Where PCP does not shard KV, a group sharded over all of cpsim's N (or over exactly DCP) is the
    release's DCP-sharded group."""
    n = g.world(s.cp)
    if n == 1:
        return "replicated"
    return "sharded" if n in (s.cp.world, kv_world(s, p)) else "partial-replica"


def scenario_for(s, p: Profile):
    """The scenario as profile ``p``'s runtime lays it out; ConfigError (exit 2) naming the field where
    the release cannot express a group's layout.

    * vLLM shards KV over DCP only: with PCP > 1 a sharded group becomes CP size DCP (replicated over
      PCP: ranks with the same DCP rank hold the same shard), so allocation, launch and oracle agree.
    * A release without a per-group CP flag (vLLM 0.18-0.30: ``shards_attention``) shards every attention
      group over its KV world: a group in a layout it lacks is laid out sharded, as that release builds
      the model. vLLM 0.29-0.30 also build replicated slot-mapped groups (``MambaSpec``, replicated
      across DCP, slot-mapped under CP_SIZE = DCP): a replicated group stays replicated there and is
      judged so. With ``dcp_sharded`` (0.31+) a group is all of DCP or replicated: a partial replica
      is not a false failure but a scenario that release cannot run (exit 2).

    Idempotent: the result maps to itself."""
    kv = kv_world(s, p)
    groups = []
    for i, g in enumerate(s.groups):
        if g.row_blocks and p.name != "cpsim":
            raise ConfigError(f"groups[{i}].row_blocks",
                              f"group {g.name!r} is a tail group narrower than the sequence: not expressible under "
                              f"profile {p.name} ({p.releases} build none; KpoolTailSpec, vLLM #56380, is in no "
                              f"release cpsim has read)")
        lay = layout_of(s, p, g)
        if kv > 1 and g.kind == "attention" and lay not in p.group_layouts and p.shards_attention and not g.row_blocks:
            lay = "sharded"
        elif kv > 1 and g.kind == "attention" and lay not in p.group_layouts:
            what = (f"a partial replica (CP size {g.world(s.cp)} of {kv})" if lay == "partial-replica"
                    else "a replicated group")
            raise ConfigError(f"groups[{i}].cp_size",
                              f"group {g.name!r} is {what}: not expressible under profile {p.name} "
                              f"({p.releases}: groups {', '.join(p.group_layouts)})")
        if lay == "sharded" and g.world(s.cp) != kv:
            g = dataclasses.replace(g, cp_size=kv, cp_sharded=True) if kv > 1 else dataclasses.replace(g, cp_size=1)
            if cp_layout_error(s.cp, g):
                raise ConfigError("cp.interleave", f"{cp_layout_error(s.cp, g)}: under profile {p.name} group {g.name!r} "
                                                   f"is sharded over {kv} ({p.releases} shard every attention group)")
        groups.append(g)
    if tuple(groups) == tuple(s.groups):
        return s
    laid_out = s.replace(groups=tuple(groups))
    for i, (before, g) in enumerate(zip(s.groups, groups)):
        need = max_blocks_needed(laid_out, g)
        if before != g and need > g.num_blocks - 1:  # fewer ranks share the group: each holds more blocks
            raise ConfigError(f"groups[{i}]({g.name}).num_blocks",
                              f"{g.num_blocks} too small under profile {p.name}: sharded over DCP {kv} only, a rank "
                              f"needs {need} blocks and block 0 is reserved")
    return laid_out


def not_judged(p: Profile, path: str, g) -> str:
    """Why the slots of group ``g`` on ``path`` are not judged under profile ``p`` ("" when they are)."""
    if g.circular and not p.ring_windows and not ring_is_pad(p, path, g):
        return (f"group {g.name}: a ring-buffer sliding window has no slot rule in {p.releases} (no released "
                f"ring slot rule{'' if family(path) == 'v2' else ' on v1'}); its slots on {family(path)} are not "
                f"judged")
    if g.slot_mapped:
        return ""
    if p.state_groups == "untouched":
        return f"group {g.name}: {p.releases} leave a state (mamba) group's slot buffer as it was; not judged"
    if p.state_groups.startswith("slots") and family(path) == "v1":
        return (f"group {g.name} on the v1 paths: vLLM's v1 skips state (mamba) groups, leaving their buffer as it "
                f"was; not judged (n/a)")
    return ""


def state_slots(p: Profile, path: str, g) -> bool:
    """Group ``g`` is a state group whose slots ``p``'s release computes on ``path`` (vLLM MRV2 from 0.29:
    ``slot_mapping_enabled`` true for ``MambaSpec``): judged by the plain table rule, unsharded from 0.31
    (``dcp_sharded`` false), sharded over DCP in 0.29-0.30 (no flag: ``CP_SIZE`` applies to every group)."""
    return not g.slot_mapped and p.state_groups.startswith("slots") and family(path) == "v2"


def ring_is_pad(p: Profile, path: str, g) -> bool:
    """A ring group on MRV2 from 0.29: the release's ``CircularBufferSpec`` (its pages addressed by the
    ring itself), launched with ``slot_mapping_enabled`` false, so every entry is PAD."""
    return g.circular and not p.ring_windows and p.circular_pad and family(path) == "v2"


def state_as_table(s, p: Profile, g):
    """The plain attention group whose rule ``p``'s release applies to state group ``g``'s slots."""
    world = kv_world(s, p) if p.state_groups == "slots-sharded" else 1
    return dataclasses.replace(g, kind="attention", cp_sharded=world > 1, cp_size=world if world > 1 else 1,
                               prefix_cacheable=False)


def padding_end(p: Profile, num_tokens: int, num_tokens_padded: int, entries: int) -> int:
    """Buffer entries the profile promises: the whole buffer, or (vllm-ascend's torch path, whose runner
    pads only up to the padded count) the scheduled tokens and the graph padding after them."""
    if p.padding_reach == "buffer":
        return entries
    return min(entries, max(num_tokens, num_tokens_padded))


def notes(s, p: Profile, paths) -> list[str]:
    """What profile ``p`` leaves unjudged or reshapes in scenario ``s``, one line each (for every report)."""
    out = []
    if not p.pcp_shards_kv and s.cp.pcp > 1:
        out.append(f"profile {p.name}: PCP does not shard KV ({p.releases} pass the DCP size and rank); sharded "
                   f"groups are judged over DCP {s.cp.dcp}, replicated over PCP {s.cp.pcp}")
    if p.padding_reach == "padded-count":
        out.append(f"profile {p.name}: PAD is judged up to the padded count "
                   f"({max(s.batch.num_tokens, s.batch.num_tokens_padded)} entries), not to the end of the buffer")
    for path in paths:
        for g in s.groups:
            why = not_judged(p, path, g)
            if why and why not in out:
                out.append(why)
            elif ring_is_pad(p, path, g):
                line = (f"group {g.name} on {path}: a ring is {p.releases}'s CircularBufferSpec, launched with "
                        f"slot_mapping_enabled false; judged all PAD")
                if line not in out:
                    out.append(line)
            elif state_slots(p, path, g):
                how = "sharded over DCP like every group" if p.state_groups == "slots-sharded" else "unsharded"
                line = (f"group {g.name} on {path}: {p.releases} computes slots for state (mamba) groups; "
                        f"judged by the plain table rule ({how}), tokens past the group's live blocks not judged")
                if line not in out:
                    out.append(line)
    return out

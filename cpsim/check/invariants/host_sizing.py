"""Whether the host sized what it hands the kernel: block-table widths and the slot buffer."""

from __future__ import annotations

from cpsim import layout
from cpsim.check import profiles
from cpsim.check.findings import Violation, host_array
from cpsim.check.invariants import Invariant
from cpsim.layout import cdiv
from cpsim.scenario import Scenario


def group_positions(max_model_len: int, g) -> int:
    """Positions a group's rows must hold: ``cdiv(max_model_len, r)`` for a compressed group, whose own
    positions count every r-th token (vllm-ascend 0.23.0.post1 ``utils.get_compressed_pos_and_indices``:
    ``total // r``), so its release table is ``max(cdiv(W, r), 1)`` entries (``BlockTable.__init__``)."""
    return cdiv(max_model_len, g.compress_ratio)


def block_sizing(ctx, path, g, widths: list[int], entry_sizes: list[int]) -> list[Violation]:
    """Each rank's table holds every entry its group's spec needs. cpsim's profile also wants the exact
    width; a release profile accepts wider tables (vLLM aligns to 128 tokens; ``--strict-sizing`` notes it)."""
    s = ctx.s
    mml = group_positions(s.limits.max_model_len, g)
    world = g.world(s.cp)
    prof = ctx.profile
    span = f"max_model_len {mml}" if g.compress_ratio == 1 else f"max_model_len / {g.compress_ratio} = {mml}"
    out = []
    for r, (w, e) in enumerate(zip(widths, entry_sizes)):
        if g.circular or g.row_blocks:  # a ring, a tail group: its row's blocks, by design
            need, exact = (g.row_blocks or 1) * (g.block_size // e), None
        elif not g.slot_mapped and prof.state_width == "spec":
            # vLLM's MambaSpec has two widths: 1 + speculative blocks (state-indexed rows), or one entry per
            # block of max_model_len in align mode (position-indexed rows, what cpsim allocates); either is
            # a table that release builds, so the narrower of the two is the need.
            spec = profiles.state_entries(prof, mml, g.block_size, s.limits.num_speculative_tokens)
            need = min(spec, cdiv(mml, g.block_size)) * (g.block_size // e)
            exact = None
        elif prof.width_rule != "exact":
            need = layout.max_table_index(mml, g.block_size, e, world, s.cp.interleave) + 1
            exact = None
        else:
            need = layout.max_table_index(mml, g.block_size, e, world, s.cp.interleave) + 1
            exact = layout.table_width(mml, g.block_size, world) * (g.block_size // e) if world > 1 else None
        if w < need:
            out.append(Violation("block-sizing", path, g.name, 1,
                                 f"rank {r}: table width {w} < {need} entries needed for positions "
                                 f"< {span} (block out of range)", [r]))
        elif exact is not None and w != exact:
            out.append(Violation("block-sizing", path, g.name, 1,
                                 f"rank {r}: table width {w} != cdiv({mml}, {g.block_size} x {world})"
                                 f"{' x ' + str(g.block_size // e) if g.block_size != e else ''} = {exact}", [r]))
    return out


def sizing_waste(s: Scenario, gathered: dict, profile=None) -> list[str]:
    """``--strict-sizing``: tables wider and slot buffers larger than the profile's rule, one line each.

    Waste, not a violation: a wider table or a bigger buffer maps every token right. The rule is
    the widest table the profile's host builds (cpsim: exact ``cdiv(mml, B·g)``; vLLM >= 0.27:
    the spec's entries rounded up to 128 tokens, ``get_block_table_width``)."""
    prof = profile or profiles.PROFILES["cpsim"]
    out = []
    for path, G in gathered.items():
        if getattr(G, "failures", None):
            continue
        widths, entry_sizes = host_array(G.widths).T.tolist(), host_array(G.entry_sizes).T.tolist()
        for gi, g in enumerate(s.groups):
            mml = group_positions(s.limits.max_model_len, g)
            for r, (w, e) in enumerate(zip(widths[gi], entry_sizes[gi])):
                per = g.block_size // e
                if g.circular:
                    rule = per
                elif not g.slot_mapped and prof.state_width == "spec":
                    rule = profiles.state_entries(prof, mml, g.block_size, s.limits.num_speculative_tokens) * per
                else:
                    need = layout.max_table_index(mml, g.block_size, e, g.world(s.cp), s.cp.interleave) + 1
                    phys = layout.cdiv(need, per)
                    if prof.width_rule == "aligned-128" and g.slot_mapped:
                        phys = profiles.aligned_width(phys, g.block_size)
                    rule = phys * per
                if w > rule:
                    out.append(f"{path} group {g.name} rank {r}: table width {w} > {rule} entries the "
                               f"{prof.name} rule needs ({w - rule} unused per row)")
        entries = host_array(G.slots).shape[2]
        need = profiles.slot_buffer_need(prof, s.limits, path)
        if entries > need:
            out.append(f"{path}: slot buffer {entries} > {need} entries (scheduled tokens"
                       f"{' + MTP drafts' if profiles.draft_reserve(prof, path) else ''})")
    return out


def capacity(ctx, path, entries: int) -> list[Violation]:
    """The slot buffer holds what the profile's host must hold (``profiles.slot_buffer_need``) and
    every entry this batch writes (a profile without the draft reserve still cannot drop tokens)."""
    lim = ctx.s.limits
    reserve = profiles.draft_reserve(ctx.profile, path)
    host = profiles.slot_buffer_need(ctx.profile, lim, path)
    demand = max(ctx.n, ctx.s.batch.num_tokens_padded)  # a spec request's scheduled tokens hold its drafts
    need = max(host, demand)
    if entries >= need:
        return []
    rule = (f"{lim.max_num_batched_tokens} batched + {max(lim.num_speculative_tokens - 1, 0)} draft x "
            f"{lim.max_num_reqs} requests" if reserve
            else f"{lim.max_num_batched_tokens} batched under {ctx.profile.name}")
    rule = rule if need == host else f"max({rule}, the {demand} this batch writes)"
    return [Violation("capacity", path, "*", need - entries,
                      f"slot buffer holds {entries} entries; needs {need} = {rule} (this batch writes {demand})")]


BLOCK_SIZING = Invariant("block-sizing", "group", lambda c: block_sizing(c.ctx, c.path, c.g, c.widths, c.entry_sizes),
                         count=lambda c: len(c.widths))
CAPACITY = Invariant("capacity", "path", lambda c: capacity(c.ctx, c.path, c.entries), count=lambda c: 1)

"""A picture of one scenario's CP layout: who owns each token and where it landed.

A table of violation counts says *that* something broke; this figure shows *how*.
For every drawn path (columns, v1 and v2 side by side) and KV-cache group (rows):

* a token strip: the scheduled positions of every request, wrapped at a width that
  is a multiple of ``N * I`` so a healthy layout shows clean vertical bands, each
  token coloured by the rank that actually holds a real slot for it;
* a block grid: one row per (rank, physical block) that received a token this
  step, one cell per slot offset ``0 .. B-1``, each cell coloured by the rank the
  global rule says owns the position written there (so a healthy rank's rows are
  one colour, and a rank holding foreign tokens shows other colours).

Tokens whose slot differs from the reference on any rank get a red outline; each
coordinator violation is annotated with its invariant's name at its first example,
and listed in the panel's title. Colours are the same everywhere: one per rank,
grey for "every rank" (unsharded groups), pale red for "no rank", black for
"several" (a collision or a token held twice).

matplotlib is imported lazily (``draw`` extra) and always with the Agg backend.
"""

from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from cpsim.check import coordinator, reference

from cpsim import layout
from cpsim.allocator import Allocation, allocate
from cpsim.errors import ConfigError
from cpsim.layout import PAD_SLOT_ID, POISON
from cpsim.scenario import KVGroup, Scenario

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

# Beyond these the figure stops being readable; we refuse rather than draw mush.
MAX_RANKS = 16
MAX_REQUESTS = 64
MAX_TOKENS = 4096
MAX_BLOCK_SIZE = 512
MAX_STRIP_ROWS = 160        # wrapped token rows per group
MAX_BLOCK_ROWS = 480        # (rank, block) rows per path, all groups together
MAX_STRAY_ROWS = 16         # rows for blocks a rank was never given, per panel
DEFAULT_PATHS = ("v1", "v2")

_RANK_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
                 "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d"]
_ALL_COLOUR = "#8a8a8a"
_NONE_COLOUR = "#f4c7c7"
_SEVERAL_COLOUR = "#000000"
_BAD = "#e00000"

# Text sizes in points. The smallest is 8.5 pt: 11.3 px where the picture is shown at 96 px per
# inch (the HTML report embeds it so), the least that stays legible.
FONT_MIN = 8.5
FONT_TITLE = 9.5
FONT_SUPTITLE = 11.0
ROW_IN = 0.15               # inches per strip or block row: one FONT_MIN label each
COLUMN_IN = 8.0             # inches per drawn path
LEGEND_ENTRY_IN = 1.7       # inches one legend entry takes at FONT_MIN


@dataclass
class Panel:
    """Everything drawn for one (path, group), as plain arrays (testable without matplotlib)."""

    path: str
    group: KVGroup
    enabled: bool
    strip: np.ndarray                      # [strip rows, W] code, -1 = no token
    strip_bad: np.ndarray                  # [strip rows, W] bool
    strip_labels: list[str]
    blocks: np.ndarray                     # [block rows, B] code, -1 = empty slot
    blocks_bad: np.ndarray                 # [block rows, B] bool
    block_labels: list[str]
    block_keys: list[tuple[int, int]]      # (rank, physical block id) of each block row
    stray_dropped: int = 0
    note: str = ""
    marks: list[tuple[str, str, int, int]] = field(default_factory=list)  # (invariant, "strip"|"blocks", row, col)
    violations: list[coordinator.Violation] = field(default_factory=list)


@dataclass
class Picture:
    scenario: Scenario
    paths: list[str]
    panels: dict[tuple[str, int], Panel]
    verdicts: list[coordinator.Verdict]
    width: int
    skipped: list[str]


# ---- size guard ------------------------------------------------------------------

def strip_width(s: Scenario) -> int:
    """Wrap width: a multiple of N*I (so each rank is one band), between 64 and 256 when possible."""
    unit = s.cp.world * s.cp.interleave
    if unit > 256:
        return 256
    return unit * max(1, -(-64 // unit))


def _strip_rows(s: Scenario, w: int) -> int:
    return sum(((r.seq_len - 1) // w - r.context_len // w + 1) if r.num_tokens else 1 for r in s.batch.requests)


def check_size(s: Scenario) -> None:
    """Raise ConfigError when the scenario is too big to draw readably."""
    def too_big(what: str, value: int, limit: int) -> None:
        if value > limit:
            raise ConfigError("draw", f"scenario {s.name!r} is too big to draw: {what} {value} > {limit}; "
                                      f"draw a smaller scenario (fewer ranks, requests or tokens)")
    too_big("CP world size", s.cp.world, MAX_RANKS)
    too_big("requests", s.batch.num_reqs, MAX_REQUESTS)
    too_big("scheduled tokens", s.batch.num_tokens, MAX_TOKENS)
    too_big("physical block size", max(g.block_size for g in s.groups), MAX_BLOCK_SIZE)
    too_big("wrapped token rows", _strip_rows(s, strip_width(s)), MAX_STRIP_ROWS)
    pos = torch.from_numpy(s.batch.positions())
    req = torch.from_numpy(s.batch.token_request())
    rows = 0
    for gi, g in enumerate(s.groups):
        if not g.slot_mapped:
            continue
        for r in range(g.world(s.cp)):  # replicas (r >= g) are drawn only where they differ
            ref = reference.group_slots(s, g, allocate(s, r, gi), r, pos, req)
            rows += len(torch.unique(ref[ref != PAD_SLOT_ID] // g.block_size))
    too_big("touched (rank, block) rows", rows, MAX_BLOCK_ROWS)


# ---- data ------------------------------------------------------------------------

def _real(x: torch.Tensor) -> torch.Tensor:
    return (x != PAD_SLOT_ID) & (x != POISON)


def _codes(world: int) -> tuple[int, int, int]:
    """Codes after the rank colours: every rank, no rank, several ranks."""
    return world, world + 1, world + 2


def _panel(s: Scenario, path: str, gi: int, G, allocs_world: list[list[Allocation]],
           refs: torch.Tensor, w: int, drawn: dict) -> Panel:
    g = s.groups[gi]
    R = s.cp.world
    ALL, NONE, SEVERAL = _codes(R)
    pos = torch.from_numpy(s.batch.positions())
    req = torch.from_numpy(s.batch.token_request())
    n = int(pos.numel())
    full = G.slots[:, gi, :]
    x = full[:, :n] if full.shape[1] >= n else torch.cat(
        [full, torch.full((R, n - full.shape[1]), POISON, dtype=full.dtype)], 1)
    enabled = bool(G.enabled[:, gi].any())
    real = _real(x)
    gw = g.world(s.cp)
    bad_tok = (x != refs).any(0) if enabled and g.slot_mapped else torch.zeros(n, dtype=torch.bool)

    # Token strip: one row per (request, p // w).
    row_of: dict[tuple[int, int], int] = {}
    labels: list[str] = []
    for i, r in enumerate(s.batch.requests):
        if not r.num_tokens:
            row_of[(i, -1)] = len(labels)
            labels.append(f"req{i} {r.kind} (no tokens)")
            continue
        for k in range(r.context_len // w, (r.seq_len - 1) // w + 1):
            row_of[(i, k)] = len(labels)
            labels.append(f"req{i} {r.kind} p{k * w}" if k == r.context_len // w else f"p{k * w}")
    strip = np.full((len(labels), w), -1, dtype=np.int64)
    strip_bad = np.zeros_like(strip, dtype=bool)
    # A partially replicated group (1 < g < N) is drawn from its first replica set; the
    # other sets show up in the block grid, and their mismatches as outlines.
    first = real[:gw] if 1 < gw < R else real
    cnt = first.sum(0)
    holder = first.to(torch.int64).argmax(0)
    code = torch.where(cnt == 1, holder, torch.full_like(holder, SEVERAL))
    code = torch.where(cnt == 0, torch.full_like(code, NONE), code)
    if gw == 1 and R > 1:
        code = torch.where(cnt == R, torch.full_like(code, ALL), code)
    rows = np.array([row_of[(int(i), int(p) // w)] for i, p in zip(req, pos)], dtype=np.int64)
    cols = (pos % w).numpy()
    if enabled and g.slot_mapped:
        strip[rows, cols] = code.numpy()
        strip_bad[rows, cols] = bad_tok.numpy()

    # Block grid: rows (rank, physical block) in the union the caller collected.
    keys = drawn[gi]["rows"]
    index = {k: j for j, k in enumerate(keys)}
    B = g.block_size
    blocks = np.full((len(keys), B), -1, dtype=np.int64)
    blocks_bad = np.zeros_like(blocks, dtype=bool)
    want = layout.owner_rank(pos, gw, s.cp.interleave) if gw > 1 else torch.full_like(pos, ALL)
    writers: dict[tuple[int, int], set[int]] = {}
    if enabled and g.slot_mapped:
        for r in range(R):
            idx = real[r].nonzero().flatten()
            sl = x[r, idx]
            for t, slot in zip(idx.tolist(), sl.tolist()):
                j = index.get((r, slot // B))
                if j is None:
                    continue
                o = slot % B
                writers.setdefault((j, o), set()).add(int(req[t]) if g.circular else t)
                # Owner inside this rank's replica set, so a healthy rank's rows are its own colour.
                blocks[j, o] = int(want[t]) + (r // gw) * gw if 1 < gw < R else int(want[t])
                if slot != int(refs[r, t]):
                    blocks_bad[j, o] = True
        for (j, o), who in writers.items():
            if len(who) > 1:
                blocks[j, o] = SEVERAL
                blocks_bad[j, o] = True
    note = "" if g.slot_mapped else f"{g.kind} group: no per-token slots"
    if g.slot_mapped and not enabled:
        note = f"{path} does not map group {g.name}"
    return Panel(path, g, enabled, strip, strip_bad, labels, blocks, blocks_bad,
                 drawn[gi]["labels"], list(keys), drawn[gi]["stray"], note)


def _rows_for_group(s: Scenario, gi: int, gathered: dict, paths: list[str],
                    allocs_world: list[list[Allocation]], refs: torch.Tensor) -> dict:
    """Union of (rank, block) rows over the drawn paths and the reference, so columns align."""
    g = s.groups[gi]
    R = s.cp.world
    B = g.block_size
    n = int(refs.shape[1])
    owned: list[dict[int, tuple[int, int]]] = []
    for r in range(R):
        owned.append({int(q): (i, k) for i, blk in enumerate(allocs_world[r][gi].blocks)
                      for k, q in enumerate(blk.tolist())})
    found: set[tuple[int, int]] = set()
    for r in range(R):
        sources = [refs[r]]
        for p in paths:
            G = gathered[p]
            if not bool(G.enabled[r, gi]):
                continue
            xr = G.slots[r, gi, :n]
            if r >= g.world(s.cp) and not bool((xr != refs[r, : xr.shape[0]]).any()):
                continue   # a replica (r >= g; every r > 0 when unsharded) drawn only when it differs
            sources.append(xr)
        if r >= g.world(s.cp) and len(sources) == 1:
            continue
        for src in sources:
            sl = src[_real(src)]
            found |= {(r, int(q)) for q in torch.unique(torch.div(sl, B, rounding_mode="floor")).tolist()}
    mine = sorted((k for k in found if k[1] in owned[k[0]]), key=lambda k: (k[0], *owned[k[0]][k[1]]))
    stray = sorted(k for k in found if k[1] not in owned[k[0]])
    dropped = max(0, len(stray) - MAX_STRAY_ROWS)
    stray = stray[:MAX_STRAY_ROWS]
    rows = sorted(mine + stray, key=lambda k: (k[0], 0 if k in set(mine) else 1,
                                               owned[k[0]].get(k[1], (1 << 30, k[1]))))
    labels = []
    for r, q in rows:
        if q in owned[r]:
            i, k = owned[r][q]
            labels.append(f"r{r} req{i} #{k} (blk {q})")
        else:
            labels.append(f"r{r} blk {q}: not its block")
    return {"rows": rows, "labels": labels, "stray": dropped}


def build(s: Scenario, gathered: dict, allocs_world: list[list[Allocation]],
          verdicts: list[coordinator.Verdict], paths: list[str] | None = None) -> Picture:
    """Arrays for every (path, group) panel plus where each violation is marked."""
    paths = [p for p in (paths or list(gathered)) if p in gathered]
    skipped = [p for p in (paths or []) if p not in gathered]
    w = strip_width(s)
    pos = torch.from_numpy(s.batch.positions())
    req = torch.from_numpy(s.batch.token_request())
    tok = {(int(i), int(p)): t for t, (i, p) in enumerate(zip(req.tolist(), pos.tolist()))}
    panels: dict[tuple[str, int], Panel] = {}
    for gi, g in enumerate(s.groups):
        if not g.slot_mapped:
            continue   # mamba / state groups have no per-token slots; their violations go in the title
        refs = torch.stack([reference.group_slots(s, g, allocs_world[r][gi], r, pos, req)
                            for r in range(s.cp.world)])
        drawn = {gi: _rows_for_group(s, gi, gathered, paths, allocs_world, refs)}
        for p in paths:
            panels[(p, gi)] = _panel(s, p, gi, gathered[p], allocs_world, refs, w, drawn)
    for v in verdicts:
        for vio in v.violations:
            gi = next((i for i, g in enumerate(s.groups) if g.name == vio.group), None)
            if gi is None or (vio.path, gi) not in panels:
                continue
            panel = panels[(vio.path, gi)]
            panel.violations.append(vio)
            if any(m[0] == vio.invariant for m in panel.marks):
                continue
            mark = _locate(s, panel, vio, tok, gathered[vio.path], gi, w)
            if mark:
                panel.marks.append((vio.invariant, *mark))
    for panel in panels.values():  # every violated invariant gets its callout, with no arrow when it has no cell
        for inv in dict.fromkeys(v.invariant for v in panel.violations):
            if not any(m[0] == inv for m in panel.marks):
                panel.marks.append((inv, "note", 0, 0))
    return Picture(s, paths, panels, verdicts, w, skipped)


def _locate(s: Scenario, panel: Panel, vio, tok: dict, G, gi: int, w: int) -> tuple[str, int, int] | None:
    """Where to point at a violation's first locatable example: its slot, else its token."""
    B = panel.group.block_size
    for e in vio.examples:
        if e.request is None or e.position is None or (e.request, e.position) not in tok:
            continue
        t = tok[(e.request, e.position)]
        if e.rank is not None and t < G.slots.shape[2]:
            slot = int(G.slots[e.rank, gi, t])
            if slot not in (PAD_SLOT_ID, POISON):
                if (e.rank, slot // B) in panel.block_keys:
                    return "blocks", panel.block_keys.index((e.rank, slot // B)), slot % B
        row = _strip_row(s, e.request, e.position, w)
        return "strip", row, e.position % w
    for e in vio.examples:  # an entry with no token (padding, the tail): the block its wrong slot landed in
        if e.rank is not None and str(e.actual).lstrip("-").isdigit():
            slot = int(e.actual)
            if slot >= 0 and (e.rank, slot // B) in panel.block_keys:
                return "blocks", panel.block_keys.index((e.rank, slot // B)), slot % B
    return None


def _strip_row(s: Scenario, request: int, position: int, w: int) -> int:
    row = 0
    for i, r in enumerate(s.batch.requests):
        if i == request:
            return row + position // w - r.context_len // w
        row += ((r.seq_len - 1) // w - r.context_len // w + 1) if r.num_tokens else 1
    raise ValueError(f"request {request} not in batch")


# ---- matplotlib ------------------------------------------------------------------

def _mpl():
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("draw", "matplotlib is not installed: pip install -e '.[draw]'") from None
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure
    return matplotlib, Figure


def _cmap(world: int):
    from matplotlib.colors import ListedColormap
    colours = [_RANK_COLOURS[r % len(_RANK_COLOURS)] for r in range(world)]
    return ListedColormap(colours + [_ALL_COLOUR, _NONE_COLOUR, _SEVERAL_COLOUR])


def _outline(ax, bad: np.ndarray) -> None:
    """Red outlines around runs of bad cells (one rectangle per horizontal run)."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle
    rects = []
    for row in np.flatnonzero(bad.any(1)):
        cols = np.flatnonzero(bad[row])
        starts = np.r_[cols[0], cols[1:][np.diff(cols) > 1]]
        ends = np.r_[cols[:-1][np.diff(cols) > 1], cols[-1]]
        rects += [Rectangle((a - 0.5, row - 0.5), b - a + 1, 1) for a, b in zip(starts, ends)]
    if rects:
        ax.add_collection(PatchCollection(rects, facecolor="none", edgecolor=_BAD, linewidth=1.0, zorder=3))


def _image(ax, data: np.ndarray, world: int) -> None:
    ax.imshow(np.ma.masked_less(data, 0), cmap=_cmap(world), vmin=-0.5, vmax=world + 2.5,
              aspect="auto", interpolation="nearest")
    ax.set_facecolor("white")


def _short(text: str, n: int = 110) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def kernel_lines(subjects: dict | None) -> list[str]:
    """The kernel under test on each path for the figure's title (none when all are built-in)."""
    out = []
    for path, sub in (subjects or {}).items():
        if sub.get("kind") == "builtin" and not sub.get("replay"):
            continue
        who = "built-in" if sub.get("kind") == "builtin" else (
            f"{sub['spec'].rpartition(':')[2]} ({sub.get('abi', '')}"
            + (f", sha256 {sub['sha256']}" if sub.get("sha256") else "") + ")")
        if sub.get("replay"):
            who += f" + replay {sub['replay']['spec'].rpartition(':')[2]}"
        out.append(f"kernel under test on {path}: {who}")
    return out


def render(pic: Picture, title: str = "", subjects: dict | None = None) -> "Figure":
    """The matplotlib Figure (not shown, not saved): tests read its texts.

    ``subjects`` (``cpsim.kernels.subject``) names the kernel under test on each path in the title."""
    _, Figure = _mpl()
    from matplotlib.patches import Patch
    s = pic.scenario
    R = s.cp.world
    groups = [gi for gi, g in enumerate(s.groups) if g.slot_mapped]
    heights = []
    for gi in groups:
        p0 = pic.panels.get((pic.paths[0], gi)) if pic.paths else None
        nstrip = p0.strip.shape[0] if p0 is not None else 1
        nblk = p0.blocks.shape[0] if p0 is not None else 0
        p0_lines = 2 + min(len(p0.violations), 4) if p0 is not None else 1
        heights += [0.6 + 0.2 * p0_lines + ROW_IN * nstrip, 0.6 + ROW_IN * max(nblk, 2)]
    ncol = max(len(pic.paths), 1)
    fig = Figure(figsize=(COLUMN_IN * ncol, 2.2 + sum(heights)), layout="constrained", dpi=100)
    if not pic.paths or not groups:
        fig.suptitle(f"{s.name}: nothing to draw (no applicable path or no slot-mapped group)")
        return fig
    gs = fig.add_gridspec(len(heights), ncol, height_ratios=heights)
    for c, path in enumerate(pic.paths):
        for k, gi in enumerate(groups):
            _draw_panel(fig, gs[2 * k, c], gs[2 * k + 1, c], pic.panels[(path, gi)], pic, R)
    verdict_line = "all invariants hold" if coordinator.passed(pic.verdicts) else "invariants violated"
    lines = [title or f"{s.name} [{s.fingerprint()}]: CP {R} (DCP {s.cp.dcp} x PCP {s.cp.pcp}), "
             f"interleave {s.cp.interleave}, {s.batch.num_reqs} requests, {s.batch.num_tokens} tokens "
             f"— {verdict_line}"]
    across = [vio for v in pic.verdicts for vio in v.violations
              if (vio.path, next((i for i, g in enumerate(s.groups) if g.name == vio.group), -1)) not in pic.panels]
    lines += kernel_lines(subjects)
    lines += [_short(f"✗ {vio.invariant} [{vio.path}] {vio.group}: {vio.message}", 150) for vio in across[:6]]
    if len(across) > 6:
        lines.append(f"… {len(across) - 6} more")
    hidden = [g.name for g in s.groups if not g.slot_mapped]
    if hidden:
        lines.append(f"not drawn (no per-token slots): {', '.join(hidden)}")
    if pic.skipped:
        lines.append(f"not applicable at CP {R}: {', '.join(pic.skipped)}")
    # Lines wrapped to the canvas: a one-column figure is narrower than a long title (~0.6 em a character).
    width = max(40, int(fig.get_figwidth() * 72 / (FONT_SUPTITLE * 0.62)))
    lines = [part for line in lines for part in textwrap.wrap(line, width, subsequent_indent="  ") or [""]]
    fig.suptitle("\n".join(lines), fontsize=FONT_SUPTITLE,
                 color="black" if coordinator.passed(pic.verdicts) else _BAD)
    handles = [Patch(color=_RANK_COLOURS[r % len(_RANK_COLOURS)], label=f"rank {r}") for r in range(R)]
    handles += [Patch(color=_ALL_COLOUR, label="every rank"), Patch(color=_NONE_COLOUR, label="no rank"),
                Patch(color=_SEVERAL_COLOUR, label="several"),
                Patch(facecolor="none", edgecolor=_BAD, label="differs from reference")]
    # As many legend columns as fit the figure's width (a legend wider than the canvas is clipped).
    fit = max(1, int(fig.get_figwidth() / LEGEND_ENTRY_IN))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), fit), fontsize=FONT_MIN,
               frameon=False)
    return fig


def _draw_panel(fig, top, bottom, panel: Panel, pic: Picture, R: int) -> None:
    g = panel.group
    ax = fig.add_subplot(top)
    gw = g.world(pic.scenario.cp)
    sets = ", ".join(f"{x.start}-{x.stop - 1}" for x in layout.replica_sets(R, gw)) if 1 < gw < R else ""
    head = f"{panel.path} · group {g.name} ({g.kind}, B={g.block_size}" + \
           (f", b={g.b}" if g.bpk > 1 else "") + (", unsharded" if gw == 1 else "") + \
           (f", cp_size {gw}: replica sets {sets}; strip shows ranks {0}-{gw - 1}" if sets else "") + ")"
    lines = [head + (f" — {panel.note}" if panel.note else "")]
    # One line per violated invariant (every one is named), its first violation's message.
    by_inv: dict[str, list] = {}
    for vio in panel.violations:
        by_inv.setdefault(vio.invariant, []).append(vio)
    for inv, vios in list(by_inv.items())[:4]:
        more = f" (+{len(vios) - 1} more)" if len(vios) > 1 else ""
        lines.append(_short(f"✗ {inv} ×{sum(v.count for v in vios)}: {vios[0].message}{more}", 95))
    if len(by_inv) > 4:
        lines.append(_short(f"… also {', '.join(list(by_inv)[4:])}", 95))
    ax.set_title("\n".join(lines), fontsize=FONT_TITLE, loc="left", color=_BAD if panel.violations else "black")
    _image(ax, panel.strip, R)
    _outline(ax, panel.strip_bad)
    ax.set_yticks(range(len(panel.strip_labels)), panel.strip_labels, fontsize=FONT_MIN)
    ax.set_xlabel(f"position mod {pic.width} (token strip, colour = rank holding a real slot)", fontsize=FONT_MIN)
    ax.tick_params(axis="x", labelsize=FONT_MIN)
    axb = fig.add_subplot(bottom)
    if panel.blocks.shape[0]:
        _image(axb, panel.blocks, R)
        _outline(axb, panel.blocks_bad)
        axb.set_yticks(range(len(panel.block_labels)), panel.block_labels, fontsize=FONT_MIN)
        ranks = [k[0] for k in panel.block_keys]
        for j in range(1, len(ranks)):
            if ranks[j] != ranks[j - 1]:
                # A thicker line where a new replica set starts.
                new_set = 1 < gw < R and ranks[j] // gw != ranks[j - 1] // gw
                axb.axhline(j - 0.5, color="black", linewidth=1.6 if new_set else 0.6)
        if g.bpk > 1:
            for k in range(1, g.bpk):
                axb.axvline(k * g.b - 0.5, color="#555555", linewidth=0.5, linestyle=":")
    else:
        axb.set_yticks([])
        axb.text(0.5, 0.5, panel.note or "no slots written", ha="center", va="center", fontsize=FONT_MIN,
                 transform=axb.transAxes)
    extra = f"; {panel.stray_dropped} more stray block(s) not drawn" if panel.stray_dropped else ""
    axb.set_xlabel(f"slot offset in physical block (rows: rank, request, block #;\ncolour = owner of the "
                   f"position stored){extra}", fontsize=FONT_MIN)
    axb.tick_params(axis="x", labelsize=FONT_MIN)
    _callouts(ax, axb, panel.marks)


def _callouts(ax, axb, marks) -> None:
    """One callout per violated invariant, its box inside the axes (so inside the canvas), stacked from
    the top right; an arrow to the cell where it shows, none when it has no cell ("note")."""
    stacks = {id(ax): 0, id(axb): 0}
    for inv, where, row, col in marks:
        target = ax if where == "strip" else axb
        k = stacks[id(target)]
        stacks[id(target)] += 1
        # Two columns of callouts, right then middle, from the top down.
        xy_text = (0.98 - 0.45 * (k % 2), 0.96 - 0.3 * (k // 2) % 0.9)
        style = dict(fontsize=FONT_MIN, color=_BAD, fontweight="bold", ha="right", va="top", zorder=5,
                     bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=_BAD, lw=0.8))
        if where == "note":
            target.text(*xy_text, inv, transform=target.transAxes, **style)
            continue
        target.annotate(inv, xy=(col, row), xytext=xy_text, textcoords="axes fraction",
                        arrowprops=dict(arrowstyle="->", color=_BAD, lw=1.0), annotation_clip=False, **style)


def save(fig: "Figure", out: str | Path) -> Path:
    out = Path(out)
    if out.suffix.lower() not in (".png", ".svg"):
        raise ConfigError("--out", f"must end in .png or .svg, got {out.name!r}")
    fig.savefig(out, format=out.suffix[1:].lower())
    return out


def png_bytes(fig: "Figure", dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()

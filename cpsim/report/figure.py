"""The matplotlib figure of a ``cpsim.report.layout_picture.Picture``: one column per path, a token strip and a
block grid per group, colours by rank, red outlines where a slot differs from the reference (what
each part shows: ``cpsim.report.layout_picture``).

matplotlib is imported lazily (``draw`` extra) and always with the Agg backend.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cpsim import layout
from cpsim.check import coordinator
from cpsim.errors import ConfigError
from cpsim.report.layout_picture import Panel, Picture

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

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

"""`cpsim draw`: files are written, the picture's data follows the layout, violations are named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.text import Annotation, Text

from report_cases import STALE_TAIL, VIRTUAL_FROM_KERNEL_BLOCK, small
from cpsim import cli, layout
from cpsim.cmd.draw import figure_for, simulate
from cpsim.presets import preset
from cpsim.report import layout_picture, figure
from cpsim import scenario as sc
from cpsim.errors import ConfigError
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text)]


@pytest.fixture(scope="module")
def default_fig():
    return figure_for(sc.validate(preset("default")), runner=RUNNER)


@pytest.fixture(scope="module")
def vkb_fig():
    return figure_for(small(), knobs=VIRTUAL_FROM_KERNEL_BLOCK, runner=RUNNER)


def test_default_preset_png_and_svg(default_fig, tmp_path):
    fig, pic = default_fig
    png = figure.save(fig, tmp_path / "default.png")
    svg = figure.save(fig, tmp_path / "default.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()[:2000]
    assert pic.paths == ["v1", "v2"]                     # side by side
    assert not any("✗" in t for t in texts(fig))         # healthy: nothing flagged
    assert not any(p.strip_bad.any() or p.blocks_bad.any() for p in pic.panels.values())


def test_healthy_strip_follows_global_owner_rule():
    s = small()
    pic = simulate(s, runner=RUNNER)
    w = pic.width
    assert w % (s.cp.world * s.cp.interleave) == 0
    panel = pic.panels[("v2", 0)]
    pos = torch.from_numpy(s.batch.positions())
    req = s.batch.token_request()
    rows = [layout_picture._strip_row(s, int(i), int(p), w) for i, p in zip(req, pos)]
    got = panel.strip[rows, (pos % w).numpy()]
    assert (got == layout.owner_rank(pos, 4, 32).numpy()).all()
    # Every rank's block rows hold only positions that rank owns (one colour per rank).
    for j, (rank, _) in enumerate(panel.block_keys):
        cells = panel.blocks[j][panel.blocks[j] >= 0]
        assert len(cells) and (cells == rank).all()
    # The unsharded ring is held by every rank: drawn once, in the "every rank" colour.
    ring = pic.panels[("v2", 1)]
    every, _, _ = layout_picture._codes(s.cp.world)
    assert {k[0] for k in ring.block_keys} == {0}
    assert set(np.unique(ring.strip[ring.strip >= 0])) == {every}


def test_injected_fault_is_annotated(vkb_fig, tmp_path):
    fig, pic = vkb_fig
    failing = {(v.invariant, v.path) for v in pic.verdicts if v.status == "fail"}
    # SPEC §5: ownership is skewed across ranks, so the owner rule must break on both paths.
    assert {("owner-rule", "v1"), ("owner-rule", "v2")} <= failing
    notes = [a.get_text() for a in fig.findobj(Annotation)]
    assert "owner-rule" in notes
    all_text = "\n".join(texts(fig))
    for inv, path in failing:
        assert inv in all_text, f"{inv} ({path}) not shown in the figure"
    attn = pic.panels[("v1", 0)]
    assert attn.strip_bad.any() and attn.blocks_bad.any()
    assert not pic.panels[("v1", 1)].strip_bad.any()     # the unsharded ring is untouched by this bug
    for out in ("fault.png", "fault.svg"):
        assert figure.save(fig, tmp_path / out).stat().st_size > 10_000


def test_violation_without_token_is_listed():
    fig, pic = figure_for(small(), knobs=STALE_TAIL, paths=("v2",), runner=RUNNER)
    assert any(v.invariant == "padding" and v.status == "fail" for v in pic.verdicts)
    assert any("✗ padding" in t for t in texts(fig))


def test_too_big_is_refused():
    with pytest.raises(ConfigError) as e:
        layout_picture.check_size(sc.validate(preset("long-prefill")))
    assert e.value.field == "draw" and "131072" in e.value.rule


def test_cli_draw(tmp_path, capsys):
    f = tmp_path / "s.json"
    small().dump(f)
    out = tmp_path / "x.svg"
    assert cli.main(["draw", "--scenario", str(f), "--paths", "v2", "--out", str(out), "--quiet"], runner=RUNNER) == 0
    assert out.stat().st_size > 10_000
    assert cli.main(["draw", "--scenario", str(f), "--out", str(tmp_path / "x.pdf")], runner=RUNNER) == 2
    assert "png or .svg" in capsys.readouterr().err


def test_cli_draw_repro_knobs(tmp_path):
    import json
    f = tmp_path / "repro.json"
    f.write_text(json.dumps({"scenario": small().to_dict(), "knobs": {"virtual_from_kernel_block": True}}))
    assert cli.main(["draw", "--repro", str(f), "--paths", "v2", "--out", str(tmp_path / "r.png"), "--quiet"], runner=RUNNER) == 1


def test_cli_draw_injected_catalogue_fault(tmp_path, capsys):
    """``--inject NAME`` draws the fault's own trigger scenario with its violations."""
    out = tmp_path / "x.png"
    assert cli.main(["draw", "--inject", "stale-tail", "--out", str(out)], runner=RUNNER) == 1
    assert out.stat().st_size > 1000
    assert cli.main(["draw", "--inject", "no-such-bug", "--out", str(out)], runner=RUNNER) == 2
    assert "no-such-bug" in capsys.readouterr().err


# ---- everything inside the canvas, legible (issue 30) --------------------------------

def _checked_picture(s, knobs=None, paths=("v1", "v2"), kernels=None):
    """Run, check and lay out a picture the way the commands do (the picture itself runs nothing)."""
    from cpsim.allocator import allocate_world
    from cpsim.check import coordinator
    from cpsim.paths import Knobs
    from cpsim.run.world import run_virtual
    allocs = allocate_world(s)
    gathered = run_virtual(s, list(paths), knobs or Knobs(), kernels=kernels, allocs=allocs, runner=RUNNER)
    verdicts = coordinator.check(s, allocs, gathered, [s.fingerprint()] * s.cp.world)
    return layout_picture.build(s, gathered, allocs, verdicts, list(paths))


def outside_canvas(fig) -> list[str]:
    """Texts, callouts and legends whose drawn extent leaves the figure (1 px slack)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    box = fig.bbox
    # Tick labels exist for ticks outside the view too (never drawn): the figure's tight box covers the
    # drawn ones; every other text, callout and legend is checked on its own.
    ticks = {id(lbl) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for lbl in axis.get_ticklabels(which="both")}
    tight = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)
    bad = [] if (tight.x0 >= box.x0 - 1 and tight.y0 >= box.y0 - 1 and tight.x1 <= box.x1 + 1
                 and tight.y1 <= box.y1 + 1) else [f"drawn artists span {tight.bounds} beyond {box.bounds}"]
    for artist in [*fig.findobj(Text), *fig.legends]:
        if not artist.get_visible() or (isinstance(artist, Text) and not artist.get_text().strip()) \
                or id(artist) in ticks:
            continue
        e = artist.get_window_extent(renderer)
        if e.x0 < box.x0 - 1 or e.y0 < box.y0 - 1 or e.x1 > box.x1 + 1 or e.y1 > box.y1 + 1:
            bad.append(f"{type(artist).__name__} {getattr(artist, 'get_text', lambda: 'legend')()!r}: "
                       f"{e.x0:.0f},{e.y0:.0f}-{e.x1:.0f},{e.y1:.0f} outside {box.x1:.0f}x{box.y1:.0f}")
    return bad


def _fault_picture(name: str, paths=("v1", "v2")):
    from cpsim import faults
    f = faults.get(name)
    s = f.trigger()
    return _checked_picture(s, f.knobs_for(s), paths)


@pytest.mark.parametrize("name", ["short-request-rank", "stale-tail", "cp-applied-to-unsharded-groups"])
def test_callouts_and_legend_stay_inside_the_canvas(name):
    pic = _fault_picture(name)
    for paths in (pic.paths, pic.paths[:1]):   # side by side, and one narrow column (the capture's shape)
        pic.paths = list(paths)
        fig = figure.render(pic)
        assert not outside_canvas(fig), outside_canvas(fig)
        assert fig.legends
        marks = [m for (path, _), p in pic.panels.items() if path in paths for m in p.marks]
        assert len(fig.findobj(Annotation)) == sum(m[1] != "note" for m in marks)
    assert any(p.marks for p in pic.panels.values())   # the fault is called out somewhere


def test_matches_reference_callout_at_the_right_edge_stays_inside():
    """The callout issue 30 saw cut: a violation in the last columns of the strip."""
    pic = _checked_picture(small(), VIRTUAL_FROM_KERNEL_BLOCK)
    for panel in pic.panels.values():   # move every mark to the far right cell
        panel.marks = [(inv, where, row, (panel.strip if where == "strip" else panel.blocks).shape[1] - 1)
                       for inv, where, row, _ in panel.marks]
    fig = figure.render(pic)
    assert any(a.get_text() == "matches-reference" for a in fig.findobj(Annotation))
    assert not outside_canvas(fig), outside_canvas(fig)


def test_every_violated_invariant_is_called_out():
    pic = _fault_picture("stale-tail", ("v2",))
    fig = figure.render(pic)
    shown = {t.get_text() for t in fig.findobj(Text)}
    for panel in pic.panels.values():
        violated = {v.invariant for v in panel.violations}
        assert "padding" in violated or not panel.violations
        assert violated <= {m[0] for m in panel.marks}
        assert violated <= shown   # a callout box per invariant, arrowless when it has no cell


def test_text_is_legible_where_the_html_shows_it():
    """>= 11 px at the 96 px-per-inch size the HTML gives the picture, which is embedded at 2x."""
    from cpsim.report import html
    pic = _checked_picture(small(), VIRTUAL_FROM_KERNEL_BLOCK)
    fig = figure.render(pic)
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip()]
    assert min(sizes) * 96 / 72 >= 11, min(sizes)
    png = figure.png_bytes(fig, dpi=html.PICTURE_DPI)
    page = html.render_html(pic.scenario, pic.verdicts, png)
    w, h = html.png_size(png)
    assert w == round(fig.get_figwidth() * html.PICTURE_DPI)
    assert f'width="{w // 2}" height="{h // 2}"' in page   # shown at 96 px per inch, not shrunk to fit

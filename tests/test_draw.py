"""`cpsim draw`: files are written, the picture's data follows the layout, violations are named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.text import Annotation, Text

from report_cases import STALE_TAIL, VIRTUAL_FROM_KERNEL_BLOCK, small
from cpsim import cli, layout
from cpsim.cmd.draw import figure_for, simulate
from cpsim.report import draw
from cpsim import scenario as sc
from cpsim.errors import ConfigError


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text)]


@pytest.fixture(scope="module")
def default_fig():
    return figure_for(sc.validate(sc.preset("default")))


@pytest.fixture(scope="module")
def vkb_fig():
    return figure_for(small(), knobs=VIRTUAL_FROM_KERNEL_BLOCK)


def test_default_preset_png_and_svg(default_fig, tmp_path):
    fig, pic = default_fig
    png = draw.save(fig, tmp_path / "default.png")
    svg = draw.save(fig, tmp_path / "default.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()[:2000]
    assert pic.paths == ["v1", "v2"]                     # side by side
    assert not any("✗" in t for t in texts(fig))         # healthy: nothing flagged
    assert not any(p.strip_bad.any() or p.blocks_bad.any() for p in pic.panels.values())


def test_healthy_strip_follows_global_owner_rule():
    s = small()
    pic = simulate(s)
    w = pic.width
    assert w % (s.cp.world * s.cp.interleave) == 0
    panel = pic.panels[("v2", 0)]
    pos = torch.from_numpy(s.batch.positions())
    req = s.batch.token_request()
    rows = [draw._strip_row(s, int(i), int(p), w) for i, p in zip(req, pos)]
    got = panel.strip[rows, (pos % w).numpy()]
    assert (got == layout.owner_rank(pos, 4, 32).numpy()).all()
    # Every rank's block rows hold only positions that rank owns (one colour per rank).
    for j, (rank, _) in enumerate(panel.block_keys):
        cells = panel.blocks[j][panel.blocks[j] >= 0]
        assert len(cells) and (cells == rank).all()
    # The unsharded ring is held by every rank: drawn once, in the "every rank" colour.
    ring = pic.panels[("v2", 1)]
    every, _, _ = draw._codes(s.cp.world)
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
        assert draw.save(fig, tmp_path / out).stat().st_size > 10_000


def test_violation_without_token_is_listed():
    fig, pic = figure_for(small(), knobs=STALE_TAIL, paths=("v2",))
    assert any(v.invariant == "padding" and v.status == "fail" for v in pic.verdicts)
    assert any("✗ padding" in t for t in texts(fig))


def test_too_big_is_refused():
    with pytest.raises(ConfigError) as e:
        draw.check_size(sc.validate(sc.preset("long-prefill")))
    assert e.value.field == "draw" and "131072" in e.value.rule


def test_cli_draw(tmp_path, capsys):
    f = tmp_path / "s.json"
    small().dump(f)
    out = tmp_path / "x.svg"
    assert cli.main(["draw", "--scenario", str(f), "--paths", "v2", "--out", str(out), "--quiet"]) == 0
    assert out.stat().st_size > 10_000
    assert cli.main(["draw", "--scenario", str(f), "--out", str(tmp_path / "x.pdf")]) == 2
    assert "png or .svg" in capsys.readouterr().err


def test_cli_draw_repro_knobs(tmp_path):
    import json
    f = tmp_path / "repro.json"
    f.write_text(json.dumps({"scenario": small().to_dict(), "knobs": {"virtual_from_kernel_block": True}}))
    assert cli.main(["draw", "--repro", str(f), "--paths", "v2", "--out", str(tmp_path / "r.png"), "--quiet"]) == 1


def test_cli_draw_injected_catalogue_fault(tmp_path, capsys):
    """``--inject NAME`` draws the fault's own trigger scenario with its violations."""
    out = tmp_path / "x.png"
    assert cli.main(["draw", "--inject", "stale-tail", "--out", str(out)]) == 1
    assert out.stat().st_size > 1000
    assert cli.main(["draw", "--inject", "no-such-bug", "--out", str(out)]) == 2
    assert "no-such-bug" in capsys.readouterr().err

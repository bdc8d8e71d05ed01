"""``cpsim draw --capture PATH``: the layout picture of one captured step (or an explicit batch).

The picture is ``cpsim.report.layout_picture``'s, fed with the captured outputs and the
captured tables instead of a simulated run; by default the first step that
breaks an invariant is drawn (else the first step).
"""

from __future__ import annotations

from pathlib import Path

from cpsim.report import terminal

from cpsim.capture.steps import check_step, first_finding, iter_steps
from cpsim.check import explicit
from cpsim.errors import ConfigError


def _too_big(out) -> None:
    from cpsim.report import layout_picture
    s = out.scenario
    for what, value, limit in (("CP world size", s.cp.world, layout_picture.MAX_RANKS),
                               ("requests", s.batch.num_reqs, layout_picture.MAX_REQUESTS),
                               ("scheduled tokens", s.batch.num_tokens, layout_picture.MAX_TOKENS),
                               ("physical block size", max(g.block_size for g in s.groups), layout_picture.MAX_BLOCK_SIZE)):
        if value > limit:
            raise ConfigError("draw", f"{out.step.label.get('name', 'step')} is too big to draw: {what} {value} > "
                                      f"{limit}; shrink it first (cpsim replay PATH --shrink small.npz)")


def main(args) -> int:
    from cpsim.report import layout_picture, figure

    out_path = Path(args.out)
    if out_path.suffix.lower() not in (".png", ".svg"):
        raise ConfigError("--out", f"must end in .png or .svg, got {out_path.name!r}")
    chosen = None
    for step in iter_steps(args.capture):
        if args.step is not None and step.label.get("step", 0) != args.step:
            continue
        out = check_step(step)
        if chosen is None or (out.failed and not chosen.failed):
            chosen = out
        if out.failed or args.step is not None:
            break
    if chosen is None:
        raise ConfigError("--step", f"{args.capture} has no step {args.step}")
    _too_big(chosen)
    pic = layout_picture.build(chosen.scenario, chosen.gathered, explicit.allocations(chosen.step), chosen.verdicts)
    finding = first_finding(chosen.step, chosen.gathered, chosen.verdicts)
    name = chosen.step.label.get("name", "step")
    where = finding and " ".join(f"{k} {v}" for k, v in (("rank", finding.rank), ("group", finding.group),
                                                         ("token", finding.token)) if v is not None)
    title = args.title or (f"{name}: {finding.invariant} at {where}" if finding else f"{name}: all invariants hold")
    figure.save(figure.render(pic, title), out_path)
    if not args.quiet:
        terminal.console().print(f"wrote {out_path} ({out_path.stat().st_size // 1024} KiB): {chosen.step.label.get('name')}",
                        highlight=False)
    return 1 if chosen.failed else 0


def write_html(path: str | Path, out, extra: dict) -> None:
    """The HTML report of one checked step, with its picture drawn from the captured tables."""
    from cpsim.report import layout_picture, figure, html
    try:
        _too_big(out)
        pic = layout_picture.build(out.scenario, out.gathered, explicit.allocations(out.step), out.verdicts)
        png, note = figure.png_bytes(figure.render(pic), dpi=html.PICTURE_DPI), ""
    except ConfigError as e:
        png, note = None, f"no picture: {e.rule}"
    html.write_html(path, out.scenario, out.verdicts, png, extra, picture_note=note)

"""A self-contained HTML report to attach to a bug: no scripts, no network.

Everything is in the one file: inline CSS, the picture as a base64 PNG, the
scenario as JSON. Any command that has a scenario and verdicts can write one.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from cpsim import __version__
from cpsim.check.coordinator import INVARIANTS, Verdict, passed
from cpsim.scenario import Scenario
from cpsim.errors import ConfigError

MAX_VIOLATIONS = 200
MAX_REQUESTS = 100

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1a1a1a;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
.verdict{display:inline-block;padding:3px 10px;border-radius:4px;color:#fff;font-weight:600}
.ok{background:#1e8e3e} .bad{background:#c5221f}
table{border-collapse:collapse;margin:6px 0} th,td{border:1px solid #d0d0d0;padding:3px 8px;text-align:left}
th{background:#f3f3f3} td.pass{background:#e6f4ea;color:#1e6b32;text-align:center}
td.fail{background:#fce8e6;color:#a50e0e;font-weight:600;text-align:center} td.na{color:#999;text-align:center}
.vio{border-left:4px solid #c5221f;background:#fdf3f2;padding:6px 10px;margin:8px 0}
.vio code{font-weight:600} .muted{color:#666} pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
.picture{overflow-x:auto;max-width:100%} .picture img{border:1px solid #ddd;max-width:none}
table.kernels td,table.kernels th{font-size:13px}
"""

# The picture is rendered at PICTURE_SCALE x 96 dots per inch and shown at 96 CSS px per inch, so its
# smallest text (figure.FONT_MIN, 8.5 pt) is 11.3 px on the page and sharp on high-density screens.
PICTURE_DPI = 192
PICTURE_SCALE = 2


def _e(x: Any) -> str:
    return html.escape(str(x))


def _cell(v: Verdict | None) -> str:
    if v is None or v.status == "n/a":
        return '<td class="na">n/a</td>'
    if v.status == "not run":
        return f'<td class="na" title="{_e(v.note)}">not run</td>'
    if v.status == "pass":
        return '<td class="pass">pass</td>'
    return f'<td class="fail">FAIL {v.count}</td>'


def _grid(verdicts: list[Verdict]) -> str:
    paths = list(dict.fromkeys(v.path for v in verdicts))
    by = {(v.invariant, v.path): v for v in verdicts}
    rows = ["<tr><th>invariant</th>" + "".join(f"<th>{_e(p)}</th>" for p in paths) + "</tr>"]
    for inv in INVARIANTS:
        if not any(v.invariant == inv for v in verdicts):
            continue
        rows.append(f"<tr><th>{_e(inv)}</th>" + "".join(
            _cell(by.get((inv, p))) if (inv, p) in by else "<td></td>" for p in paths) + "</tr>")
    return "<table>" + "".join(rows) + "</table>"


def _scenario(s: Scenario) -> str:
    lim = s.limits
    out = [f"<p>CP world {s.cp.world} (DCP {s.cp.dcp} &times; PCP {s.cp.pcp}), interleave {s.cp.interleave}; "
           f"max_model_len {lim.max_model_len}, max_num_reqs {lim.max_num_reqs}, max_num_batched_tokens "
           f"{lim.max_num_batched_tokens}, speculative tokens {lim.num_speculative_tokens}; seed {s.seed}"
           f"{'; <b>allow_invalid</b>' if s.allow_invalid else ''}</p>"]
    out.append("<table><tr><th>group</th><th>kind</th><th>B</th><th>b</th><th>CP size</th><th>blocks</th></tr>")
    for g in s.groups:
        out.append(f"<tr><td>{_e(g.name)}</td><td>{_e(g.kind)}</td><td>{g.block_size}</td><td>{g.b}</td>"
                   f"<td>{g.world(s.cp)}</td><td>{g.num_blocks}</td></tr>")
    out.append("</table>")
    rows = s.batch.rows_v2()
    out.append("<table><tr><th>request</th><th>kind</th><th>context_len</th><th>num_tokens</th><th>v2 row</th></tr>")
    for i, r in enumerate(s.batch.requests[:MAX_REQUESTS]):
        out.append(f"<tr><td>{i}</td><td>{_e(r.kind)}</td><td>{r.context_len}</td><td>{r.num_tokens}</td>"
                   f"<td>{rows[i]}</td></tr>")
    out.append("</table>")
    if s.batch.num_reqs > MAX_REQUESTS:
        out.append(f'<p class="muted">… {s.batch.num_reqs - MAX_REQUESTS} more requests (see the JSON below)</p>')
    return "".join(out)


def _violations(verdicts: list[Verdict]) -> str:
    vios = [x for v in verdicts for x in v.violations]
    if not vios:
        return '<p class="muted">none</p>'
    out = []
    for x in vios[:MAX_VIOLATIONS]:
        ranks = f" ranks {_e(x.ranks)}" if x.ranks else ""
        out.append(f'<div class="vio"><code>{_e(x.invariant)}</code> [{_e(x.path)}] group {_e(x.group)}{ranks}: '
                   f"{_e(x.message)}")
        if x.examples:
            out.append("<table><tr><th>rank</th><th>request</th><th>position</th><th>expected</th>"
                       "<th>got</th></tr>")
            for e in x.examples:
                out.append("<tr>" + "".join(f"<td>{'' if val is None else _e(val)}</td>"
                                            for val in (e.rank, e.request, e.position, e.expected, e.actual))
                           + "</tr>")
            out.append("</table>")
        out.append("</div>")
    if len(vios) > MAX_VIOLATIONS:
        out.append(f'<p class="muted">… {len(vios) - MAX_VIOLATIONS} more violation(s)</p>')
    return "".join(out)


def _user_kernels(subjects: dict[str, dict] | None) -> str:
    """The user's kernels for a title: ``attr (path)``, comma-separated; "" when all are built-in."""
    names = []
    for path, sub in (subjects or {}).items():
        for x in (sub, sub.get("replay")):
            if x and x.get("kind", "user") != "builtin" and x.get("spec") not in (None, "builtin"):
                names.append(f"{x['spec'].rpartition(':')[2]} ({path})")
    return ", ".join(dict.fromkeys(names))


def _subjects(subjects: dict[str, dict] | None) -> str:
    """The kernel-under-test table of the title block."""
    if not subjects:
        return ""
    rows = ["<table class=\"kernels\"><tr><th>path</th><th>kernel under test</th><th>ABI</th><th>file</th>"
            "<th>sha256</th><th>profile</th></tr>"]
    for path, sub in subjects.items():
        for x, label in ((sub, path), (sub.get("replay"), f"{path} replay padding")):
            if not x:
                continue
            builtin = x.get("kind") == "builtin"
            name = x["spec"].rpartition(":")[2] if ":" in x["spec"] else x["spec"]
            rows.append(f"<tr><td>{_e(label)}</td><td>{'cpsim built-in' if builtin else '<b>' + _e(name) + '</b>'}"
                        f"</td><td>{_e(x.get('abi', ''))}</td><td><code>{_e(x.get('file', ''))}</code></td>"
                        f"<td><code>{_e(x.get('sha256', ''))}</code></td><td>{_e(x.get('profile', sub.get('profile', '')))}"
                        f"</td></tr>")
    return "".join(rows) + "</table>"


def render_html(s: Scenario, verdicts: list[Verdict], picture_png_bytes: bytes | None = None,
                extra: dict[str, Any] | None = None, picture_note: str = "",
                subjects: dict[str, dict] | None = None) -> str:
    ok = passed(verdicts)
    who = _user_kernels(subjects)
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>cpsim {_e(s.name)}{' · ' + _e(who) if who else ''}: {'pass' if ok else 'FAIL'}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>cpsim report: {_e(s.name)}{' · ' + _e(who) if who else ''}</h1>",
             f'<p><span class="verdict {"ok" if ok else "bad"}">'
             f'{"all invariants hold" if ok else "invariants violated"}</span> '
             f'<span class="muted">fingerprint {_e(s.fingerprint())} · cpsim {_e(__version__)}</span></p>',
             _subjects(subjects),
             "<h2>Invariants &times; paths</h2>", _grid(verdicts)]
    # The picture right after the grid: the grid says *that* something broke, the picture *how*.
    parts.append("<h2>Picture</h2>")
    if picture_png_bytes:
        b64 = base64.b64encode(picture_png_bytes).decode()
        w, h = png_size(picture_png_bytes)
        parts.append(f'<div class="picture"><img alt="CP layout of {_e(s.name)}" width="{w // PICTURE_SCALE}" '
                     f'height="{h // PICTURE_SCALE}" src="data:image/png;base64,{b64}"></div>')
    else:
        parts.append(f'<p class="muted">{_e(picture_note or "no picture")}</p>')
    parts += ["<h2>Violations</h2>", _violations(verdicts), "<h2>Scenario</h2>", _scenario(s)]
    if extra:
        parts.append("<h2>Details</h2><pre>" + _e(json.dumps(extra, indent=2, default=str)) + "</pre>")
    parts.append("<h2>Scenario JSON</h2><details><summary>show</summary><pre>"
                 + _e(json.dumps(s.to_dict(), indent=2)) + "</pre></details></body></html>\n")
    return "".join(parts)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def write_html(path: str | Path, scenario: Scenario, verdicts: list[Verdict],
               picture_png_bytes: bytes | None = None, extra: dict[str, Any] | None = None,
               picture_note: str = "", subjects: dict[str, dict] | None = None) -> None:
    Path(path).write_text(render_html(scenario, verdicts, picture_png_bytes, extra, picture_note, subjects),
                          encoding="utf-8")


def write_checked(path: str | Path, s: Scenario, gathered: dict | None, verdicts: list[Verdict],
                  extra: dict[str, Any] | None = None, subjects: dict[str, dict] | None = None,
                  picture_note: str | None = None) -> None:
    """The page of one checked scenario, with its picture when it can be drawn (else ``picture_note``)."""
    from cpsim.allocator import allocate_world

    png, note = (picture_for(s, gathered, allocate_world(s), verdicts, subjects) if gathered
                 else (None, picture_note or "no picture: the run raised before gathering"))
    write_html(path, s, verdicts, png, extra, picture_note=note, subjects=subjects)


def picture_for(s: Scenario, gathered: dict, allocs_world, verdicts: list[Verdict],
                subjects: dict[str, dict] | None = None) -> tuple[bytes | None, str]:
    """PNG of the layout for the page, or why there is none (too big, no matplotlib)."""
    from cpsim.report import layout_picture, figure

    try:
        refs = layout_picture.check_size(s, allocs_world)
        fig = figure.render(layout_picture.build(s, gathered, allocs_world, verdicts, [p for p in ("v1", "v2")
                                                                            if p in gathered] or None, refs),
                          subjects=subjects)
        return figure.png_bytes(fig, dpi=PICTURE_DPI), ""
    except ConfigError as e:
        return None, f"no picture: {e.rule}"



def render_html_many(title: str, items: list[tuple[str, Scenario, list[Verdict]]],
                     skipped: dict[str, str] | None = None, extra: dict[str, Any] | None = None,
                     subjects: dict[str, dict] | None = None, stopped: str | None = None) -> str:
    """One page for many scenarios (a sweep, the CP groups of a torchrun job): a summary table, then
    each scenario's invariant table and violations. No pictures: a sweep is too big to layout_picture.
    ``stopped``: why the run ended early (a torchrun peer died); the page is then a failure."""
    ok = stopped is None and all(passed(v) for _, _, v in items)
    verdict = ("every scenario passes" if ok else "invariants violated" if stopped is None
               else "the run stopped before the end")
    who = _user_kernels(subjects)
    title = f"{title} · {who}" if who else title
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>cpsim {_e(title)}: {'pass' if ok else 'FAIL'}</title><style>{_CSS}</style></head><body>",
             f"<h1>cpsim report: {_e(title)}</h1>",
             f'<p><span class="verdict {"ok" if ok else "bad"}">'
             f'{verdict}</span> '
             f'<span class="muted">{len(items)} scenario run(s) · cpsim {_e(__version__)}</span></p>',
             f'<p><strong>stopped:</strong> {_e(stopped)}</p>' if stopped is not None else "",
             _subjects(subjects),
             "<h2>Summary</h2><table><tr><th>scenario</th><th>CP</th><th>seed</th><th>fingerprint</th>"
             "<th>result</th></tr>"]
    for i, (label, s, verdicts) in enumerate(items):
        bad = sum(v.count for v in verdicts if v.status == "fail")
        cell = '<td class="pass">pass</td>' if passed(verdicts) else f'<td class="fail">FAIL {bad}</td>'
        parts.append(f'<tr><td><a href="#s{i}">{_e(label)}</a></td><td>{s.cp.dcp}x{s.cp.pcp}</td>'
                     f"<td>{s.seed}</td><td>{_e(s.fingerprint())}</td>{cell}</tr>")
    for label, why in (skipped or {}).items():
        parts.append(f'<tr><td>{_e(label)}</td><td></td><td></td><td></td><td class="na">skipped: {_e(why)}</td></tr>')
    parts.append("</table>")
    for i, (label, s, verdicts) in enumerate(items):
        parts += [f'<h2 id="s{i}">{_e(label)} <span class="muted">[{_e(s.fingerprint())}]</span></h2>',
                  "<details><summary>scenario</summary>", _scenario(s), "</details>",
                  _grid(verdicts), _violations(verdicts)]
    if extra:
        parts.append("<h2>Details</h2><pre>" + _e(json.dumps(extra, indent=2, default=str)) + "</pre>")
    parts.append("</body></html>\n")
    return "".join(parts)


def write_html_many(path: str | Path, title: str, items: list[tuple[str, Scenario, list[Verdict]]],
                    skipped: dict[str, str] | None = None, extra: dict[str, Any] | None = None,
                    subjects: dict[str, dict] | None = None, stopped: str | None = None) -> None:
    Path(path).write_text(render_html_many(title, items, skipped, extra, subjects, stopped), encoding="utf-8")

"""Regenerate data/bugs/matrix.md (the catalogue's entries, its detection matrix and trigger times)
from the catalogue itself; docs/BUGS.md links it.

    python scripts/update_bugs_doc.py [--jobs N] [--matrix FILE]

--matrix FILE reuses a saved ``cpsim bugs matrix --markdown`` output instead of
running the matrix again (it takes minutes on the presets).
"""

from __future__ import annotations

import argparse
import datetime
import io
import platform
import re
import time
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATRIX = ROOT / "data" / "bugs" / "matrix.md"


def replace(text: str, key: str, body: str) -> str:
    pat = re.compile(rf"(<!-- {key}:begin -->\n).*?(<!-- {key}:end -->)", re.S)
    if not pat.search(text):
        raise SystemExit(f"marker {key} missing")
    return pat.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)


def cli(argv: list[str]) -> tuple[int, str]:
    from cpsim.cli import main
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(argv)
    return rc, buf.getvalue()


def timings() -> str:
    from cpsim import faults
    from cpsim.cmd.bugs import trigger_size
    from cpsim.faults import detect
    lines = ["| fault | trigger | faulty run (s) | fixed run (s) |", "| --- | --- | --- | --- |"]
    for f in faults.registry().values():
        bad = detect.reproduce(f)
        good = detect.reproduce(f, fixed=True)
        lines.append(f"| `{f.name}` | {trigger_size(f.trigger())} | {bad.seconds:.2f} | {good.seconds:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=0)
    ap.add_argument("--matrix", metavar="FILE", help="saved `cpsim bugs matrix --markdown` output")
    args = ap.parse_args()
    from cpsim.kernels import use_interpreter
    use_interpreter()
    text = MATRIX.read_text()
    _, listing = cli(["bugs", "list", "--markdown"])
    text = replace(text, "bugs-list", listing)
    stamp = f"{platform.node()} ({platform.processor() or platform.machine()}), {datetime.date.today()}"
    if args.matrix:
        matrix = Path(args.matrix).read_text()
        how = f"`cpsim bugs matrix --markdown` on {stamp}"
    else:
        t0 = time.perf_counter()
        _, matrix = cli(["bugs", "matrix", "--markdown", "--jobs", str(args.jobs)])
        how = f"`cpsim bugs matrix --markdown --jobs {args.jobs}` on {stamp}, {time.perf_counter() - t0:.0f} s"
    text = replace(text, "bugs-matrix", f"{how}:\n\n{matrix}")
    text = replace(text, "bugs-timing", f"Measured on {stamp} (virtual world, all four paths):\n\n{timings()}")
    MATRIX.write_text(text)


if __name__ == "__main__":
    main()

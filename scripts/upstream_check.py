"""``make upstream-check``: cpsim against the host block-table classes of released vLLM versions.

For each release: a side venv (scripts/upstream_install.py, once), then one stack driver child
for all scenarios (every preset, and a short sweep of the default preset over DCP and
interleave), judged here. Prints the release x scenario x path matrix, writes it into
docs/UPSTREAM.md, saves each failing step as an explicit batch under build/upstream/.
Exit 1 when a release cannot be loaded or judged, or a finding is not in docs/upstream-known.json
(``--record`` rewrites that file from this run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpsim import scenario as sc  # noqa: E402
from cpsim.capture.batch import save  # noqa: E402
from cpsim.stack import host  # noqa: E402

RELEASES = ("vllm==0.28.0", "vllm==0.31.0", "vllm==0.33.0")
KNOWN = ROOT / "docs" / "upstream-known.json"
DOC = ROOT / "docs" / "UPSTREAM.md"
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"


def scenarios() -> list[tuple[str, sc.Scenario]]:
    out = [(name, sc.preset(name)) for name in sc.PRESETS]
    for dcp in (2, 4, 8):
        for inter in (1, 16):
            out.append((f"default dcp{dcp} I{inter}", sc.preset("default", dcp=dcp, interleave=inter, seed=dcp)))
    return out


def check_release(release: str, venvs: Path) -> tuple[list[dict], float]:
    venv = venvs / release.replace("==", "-")
    t0 = time.time()
    subprocess.run([sys.executable, str(ROOT / "scripts" / "upstream_install.py"), str(venv), release], check=True)
    installed = time.time() - t0
    named = scenarios()
    label, patches, jobs = host.drive_many([s for _, s in named], "vllm", ["v1", "v2"], str(venv / "bin" / "python"),
                                           timeout=1800)
    rows = []
    for (name, _), job in zip(named, jobs):
        if job.unsupported:
            rows.append({"release": label, "scenario": name, "path": "v1,v2", "verdict": "not expressible",
                         "detail": f"{job.unsupported[0]}: {job.unsupported[1]}", "key": f"{name}|*|unsupported"})
            continue
        for path, step in job.steps.items():
            _, verdicts = host.judge_steps({path: step})
            fails = sorted({f"{v.invariant}:{w.group}" for v in verdicts if v.status == "fail" for w in v.violations})
            repro = ""
            if fails:
                out = ROOT / "build" / "upstream" / f"{label.replace(' ', '-')}-{name.replace(' ', '_')}-{path}.json"
                out.parent.mkdir(parents=True, exist_ok=True)
                repro = str(save(step, out).relative_to(ROOT))
            rows.append({"release": label, "scenario": name, "path": path, "verdict": "fail" if fails else "pass",
                         "detail": ", ".join(fails), "repro": repro, "key": f"{name}|{path}|{','.join(fails)}"})
    return rows, installed


def markdown(rows: list[dict], known: dict) -> str:
    lines = ["| release | scenario | path | verdict | failing invariant:group | known as |", "|---|---|---|---|---|---|"]
    for r in rows:
        note = known.get(r["release"], {}).get(r["key"], "NEW") if r["verdict"] != "pass" else ""
        lines.append(f"| {r['release']} | {r['scenario']} | {r['path']} | {r['verdict']} | {r['detail']} | {note} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--venvs", default=str(ROOT / ".venv-upstream"))
    ap.add_argument("--record", action="store_true", help="rewrite docs/upstream-known.json from this run")
    args = ap.parse_args()
    known = json.loads(KNOWN.read_text()) if KNOWN.exists() else {}
    t0, rows, broken = time.time(), [], []
    for release in RELEASES:
        try:
            got, took = check_release(release, Path(args.venvs))
            rows += got
            print(f"{release}: install {took:.0f} s", flush=True)
        except Exception as e:  # a release cpsim cannot load or judge fails the check, named
            broken.append(f"{release}: {type(e).__name__}: {e}")
    if args.record:
        rec: dict = {}
        for r in rows:
            if r["verdict"] != "pass":
                rec.setdefault(r["release"], {})[r["key"]] = known.get(r["release"], {}).get(r["key"], "to classify")
        KNOWN.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        known = rec
    table = markdown(rows, known)
    print(table)
    doc = DOC.read_text()
    DOC.write_text(doc[: doc.index(BEGIN) + len(BEGIN)] + "\n" + table + "\n" + doc[doc.index(END):])
    new = [r for r in rows if r["verdict"] != "pass" and r["key"] not in known.get(r["release"], {})]
    for b in broken:
        print(f"cannot load or judge {b}")
    for r in new:
        print(f"NEW finding: {r['release']} {r['scenario']} {r['path']}: {r['detail']} ({r.get('repro', '')})")
    print(f"upstream-check: {len(rows)} rows, {len(new)} new, {len(broken)} broken, {time.time() - t0:.0f} s")
    return 1 if new or broken else 0


if __name__ == "__main__":
    sys.exit(main())

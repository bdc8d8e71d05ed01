"""Two cpsim trees on every preset: is ``cpsim run``'s output the same? (a refactor's promise, checked)

Each preset runs once per tree (``PYTHONPATH=TREE``, default options, ``--json``); the terminal text must
match byte for byte and the JSON reports key by key. Presets only one tree has, and JSON keys only one
tree writes, are listed, not failed: they are what a tree added, for the reader to judge.

    python3 scripts/same_output.py --old DIR --new DIR [--kernel-v1 FILE:FN] > out.txt
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(tree: str, preset: str, out: str, extra: list[str]) -> tuple[str, dict | None]:
    env = dict(os.environ, PYTHONPATH=tree, COLUMNS="200")
    done = subprocess.run([sys.executable, "-m", "cpsim", "run", "--scenario", preset, "--json", out, *extra],
                          cwd=tree, env=env, capture_output=True, text=True)
    data = None
    if os.path.exists(out):
        with open(out) as f:
            data = json.load(f)
        os.remove(out)
    return f"{done.stdout}{done.stderr}rc {done.returncode}\n", data


def differences(a, b, where: str = "") -> list[str]:
    if type(a) is not type(b):
        return [f"{where}: {type(a).__name__} vs {type(b).__name__}"]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'new' if k not in a else 'old'}")
            else:
                out += differences(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r:.60} vs {b!r:.60}"]


def presets(tree: str) -> list[str]:
    # b969b18 kept its presets in cpsim.scenario; asking cpsim.presets there would reach the installed tree
    code = ("import cpsim.scenario as s\nP = getattr(s, 'PRESETS', None)\n"
            "if P is None:\n    from cpsim.presets import PRESETS as P\nprint(' '.join(P))")
    return subprocess.run([sys.executable, "-c", code], cwd=tree, env=dict(os.environ, PYTHONPATH=tree),
                          capture_output=True, text=True, check=True).stdout.split()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--kernel-v1", default="")
    args = ap.parse_args()
    extra = ["--kernel-v1", args.kernel_v1] if args.kernel_v1 else []
    old, new = presets(args.old), presets(args.new)
    changed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for p in old:
            if p not in new:
                print(f"{p}: only in old")
                continue
            # one file name for both: the terminal names it
            (ta, ja), (tb, jb) = (run(t, p, f"{tmp}/{p}.json", extra) for t in (args.old, args.new))
            diff = differences(ja, jb)
            same_text = ta == tb
            changed += not same_text or any("only in" not in d for d in diff)
            print(f"{p}: terminal {'same' if same_text else 'DIFFERS'}; json "
                  f"{'same' if not diff else '; '.join(diff)}")
    for p in new:
        if p not in old:
            print(f"{p}: only in new")
    print(f"{changed} preset(s) with changed output")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())

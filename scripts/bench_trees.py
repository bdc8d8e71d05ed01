"""Two cpsim trees alternated on one machine (A B A B ...): what a change costs, with the machine's drift
paired out.

Each figure is one whole command per run, in a fresh process with the tree first on ``PYTHONPATH``:
wall seconds and the CPU seconds of the command and its children (``getrusage``). Commands:

* ``fuzz-device``: ``scripts/bench_fuzz.py --issue15-device cuda`` (the tree's own copy), its
  steady-state passes' scenarios per second parsed from its output;
* ``run-cpu``: ``cpsim run`` with a user's kernel on the default preset (Triton interpreter);
* ``torchrun-cpu``: ``launch/cpu-sim.sh 8`` (8 gloo ranks: the rank gather);
* ``help``: ``python -m cpsim --help``.

    python3 scripts/bench_trees.py --old DIR --new DIR --rounds 3 --only run-cpu,help --kernel FILE:FN --out F.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time


def commands(kernel: str, examples: int) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "fuzz-device": [py, "scripts/bench_fuzz.py", "--issue15-device", "cuda", "--examples", str(examples),
                        "--passes", "4"],
        "run-cpu": [py, "-m", "cpsim", "run", "--scenario", "default", "--dcp", "4", "--paths", "v1,v2",
                    "--kernel-v1", kernel, "--quiet"],
        "torchrun-cpu": ["launch/cpu-sim.sh", "8", "--quiet"],
        "help": [py, "-m", "cpsim", "--help"],
    }


def timed(cmd: list[str], tree: str, env_extra: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")])),
               PY=sys.executable, **env_extra)
    env.pop("TRITON_INTERPRET", None)  # fuzz-device compiles; cpu-sim.sh sets its own
    load = os.getloadavg()[0]  # the box is shared: how busy it was when the run began
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rates = [float(r) for r in re.findall(r"pass [2-9]\d*: \d+ examples, ([\d.]+)/s wall", done.stdout)]
    return {"rc": done.returncode, "wall": round(wall, 3), "cpu": round(cpu, 3), "load": round(load, 2),
            "steady_rate": round(statistics.mean(rates), 1) if rates else None,
            "tail": (done.stdout + done.stderr)[-400:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="run-cpu,torchrun-cpu,help")
    ap.add_argument("--kernel", default="")
    ap.add_argument("--examples", type=int, default=600)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    trees = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    table = commands(args.kernel, args.examples)
    results: dict = {"trees": trees, "python": sys.version.split()[0], "figures": {}}
    for name in args.only.split(","):
        env_extra = {"TRITON_INTERPRET": "1"} if name in ("run-cpu", "help") else {}
        runs = {"old": [], "new": []}
        for _ in range(args.rounds):
            for which in ("old", "new"):
                runs[which].append(timed(table[name], trees[which], env_extra))
        results["figures"][name] = runs
        for which in ("old", "new"):
            r = runs[which]
            rates = [x["steady_rate"] for x in r if x["steady_rate"] is not None]
            print(f"{name:13s} {which}: rc {[x['rc'] for x in r]}  wall median {statistics.median(x['wall'] for x in r):.2f} s"
                  f"  cpu median {statistics.median(x['cpu'] for x in r):.2f} s"
                  f"  load {min(x['load'] for x in r):.1f}-{max(x['load'] for x in r):.1f}"
                  + (f"  steady {statistics.median(rates):.1f}/s" if rates else ""), flush=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

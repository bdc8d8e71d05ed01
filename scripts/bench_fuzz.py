"""Throughput of the virtual world as `cpsim fuzz` drives it: scenarios per second.

Two workloads, each through the Triton interpreter (paths v1,v2) and through the
torch paths only (v1-torch):
  * fuzz: the scenarios `cpsim fuzz` draws by default (Hypothesis, seed 0, no
    fault, no database), strategy + virtual world + coordinator included;
  * small: fixed small shapes (CP world x groups x requests, one decode token
    each), virtual world + coordinator only.
Rates are given per CPU second of this process (what one idle core would do) and
per wall second (what this machine did while it ran, other load included).

    PYTHONPATH=$PWD python scripts/bench_fuzz.py [--examples 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from cpsim.check import coordinator  # noqa: E402
from cpsim import fuzz as fz  # noqa: E402
from cpsim import scenario as sc  # noqa: E402
from cpsim.allocator import allocate_world  # noqa: E402
from cpsim.run.world import run_virtual  # noqa: E402

PATH_SETS = {"interpreter (v1,v2)": ["v1", "v2"], "torch (v1-torch)": ["v1-torch"]}
SMALL_SHAPES = [(1, 1, 1), (2, 1, 1), (2, 2, 2), (4, 2, 2)]


def small(world: int, ngroups: int, nreq: int) -> sc.Scenario:
    groups = tuple(sc.KVGroup(f"g{i}", "attention", 16, num_blocks=64) for i in range(ngroups))
    reqs = tuple(sc.Request(100 * i + 5, 1, "decode") for i in range(nreq))
    return sc.validate(sc.Scenario("small", sc.CPConfig(world, 1, 1), groups, sc.Limits(1024, 8, 64), sc.Batch(reqs)))


def timed(fn) -> tuple[float, float]:
    c, w = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c, time.perf_counter() - w


def bench_fuzz(paths: list[str], examples: int) -> dict:
    result = {}
    cpu, wall = timed(lambda: result.update(r=fz.fuzz(fz.FuzzConfig(paths=paths, max_examples=examples, seed=0,
                                                                     database=None))))
    n = result["r"].examples
    return {"examples": n, "violation": result["r"].found, "cpu_per_s": n / cpu, "wall_per_s": n / wall}


def bench_small(paths: list[str], shape: tuple[int, int, int], reps: int) -> dict:
    s = small(*shape)

    def once():
        g = run_virtual(s, paths)
        coordinator.check(s, allocate_world(s), g, [s.fingerprint()] * s.cp.world)

    once()  # warm: imports, interpreter rewrite of the kernels
    cpu, wall = timed(lambda: [once() for _ in range(reps)])
    return {"shape": "CP %d, %d group(s), %d request(s)" % shape, "cpu_per_s": reps / cpu, "wall_per_s": reps / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as `cpsim fuzz` does
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}, "
                      f"torch {torch.__version__}",
           "load_avg_start": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M"), "results": []}
    for label, paths in PATH_SETS.items():
        r = bench_fuzz(paths, args.examples)
        out["results"].append({"workload": "fuzz default", "paths": label, **r})
        print(f"{label:22s} fuzz default ({r['examples']} examples): {r['cpu_per_s']:6.1f}/s per CPU second, "
              f"{r['wall_per_s']:6.1f}/s wall", flush=True)
        for shape in SMALL_SHAPES:
            r = bench_small(paths, shape, args.reps)
            out["results"].append({"workload": "small", "paths": label, **r})
            print(f"{label:22s} {r['shape']:32s}: {r['cpu_per_s']:6.1f}/s per CPU second, "
                  f"{r['wall_per_s']:6.1f}/s wall", flush=True)
    out["load_avg_end"] = os.getloadavg()
    print(f"load average {out['load_avg_start'][0]:.1f} -> {out['load_avg_end'][0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

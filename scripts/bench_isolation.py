"""What kernel isolation costs: whole `cpsim run` wall time, and per-scenario time as fuzz sees it.

    .venv/bin/python scripts/bench_isolation.py [--runs 3] [--scenarios 20]

(1) `cpsim run --quiet` (default preset, 8 ranks, 3 paths) as a fresh process, with
    CPSIM_KERNEL_ISOLATION=0 (in-process) and 1 (worker process, the default);
    alternating, median of --runs each.
(2) The worker's start-up alone (paid once per command, and again after a crash/timeout).
(3) In one process, `run_virtual` over --scenarios small scenarios (the mtp preset
    at CP 2, one seed each, v1 + v2 paths), after one warm-up: the steady per-scenario
    cost fuzz pays, in-process vs in the warm worker.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def whole_run(runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"in-process": [], "worker": []}
    for _ in range(runs):
        for label, flag in (("in-process", "0"), ("worker", "1")):
            env = dict(os.environ, CPSIM_KERNEL_ISOLATION=flag)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "cpsim", "run", "--quiet"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            times[label].append(time.perf_counter() - t)
    return times


def startup() -> float:
    """Seconds to start the forkserver, preload torch + cpsim, fork the worker and import Triton there."""
    from cpsim.run import isolation
    w = isolation.Worker()
    t = time.perf_counter()
    w.start("cpu")
    dt = time.perf_counter() - t
    w.stop()
    return dt


def per_scenario(n: int) -> dict[str, float]:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from cpsim.presets import preset
    from cpsim.run import isolation
    from cpsim.run.world import run_virtual

    out = {}
    for label, process in (("in-process", False), ("worker", True)):
        isolation.configure(process=process)
        run_virtual(preset("mtp", dcp=2, seed=99), ["v1", "v2"])  # warm-up: imports, worker start
        t = time.perf_counter()
        for seed in range(n):
            run_virtual(preset("mtp", dcp=2, seed=seed), ["v1", "v2"])
        out[label] = (time.perf_counter() - t) / n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scenarios", type=int, default=20)
    a = ap.parse_args()
    for label, ts in whole_run(a.runs).items():
        print(f"cpsim run --quiet, {label}: median {statistics.median(ts):.2f} s  (runs: "
              f"{', '.join(f'{t:.2f}' for t in ts)})")
    print(f"worker start-up (forkserver + preload + Triton import in the worker): {startup():.2f} s")
    for label, t in per_scenario(a.scenarios).items():
        print(f"run_virtual mtp CP 2 v1+v2, {label}: {t * 1000:.0f} ms per scenario")


if __name__ == "__main__":
    main()

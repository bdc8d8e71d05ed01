"""What reaping costs (cpsim.run.reaper): ending a worker's tree, and the marker sweep.

    .venv/bin/python scripts/bench_reaper.py [--reps 20]

(1) ``end_trees`` of one process (a stand-in for a worker: what it costs is /proc reads and
    signals, not the process), alone and with 3 setsid'd children, as ``Worker.stop`` pays it
    once per worker stop; median ms.
(2) ``sweep`` (one pass over /proc/*/environ, nothing marked), as paid after each plugin check
    and at the end of each command; median ms, with the number of processes scanned.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CHILDREN = """
import os, sys, time
for _ in range(int(sys.argv[1])):
    if os.fork() == 0:
        os.setsid()
        time.sleep(300)
        os._exit(0)
print("ready", flush=True)
time.sleep(300)
"""


def end_tree_ms(children: int, reps: int) -> float:
    from cpsim.run import reaper
    times = []
    for _ in range(reps):
        p = subprocess.Popen([sys.executable, "-c", CHILDREN, str(children)], stdout=subprocess.PIPE, text=True)
        p.stdout.readline()
        t = time.perf_counter()
        reaper.end_trees([p.pid])
        times.append((time.perf_counter() - t) * 1e3)
        p.wait(5)
    return statistics.median(times)


def sweep_ms(reps: int) -> tuple[float, int]:
    from cpsim.run import reaper
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        reaper.sweep()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), sum(d.isdigit() for d in os.listdir("/proc"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    print(f"end_trees, no children: {end_tree_ms(0, a.reps):.2f} ms")
    print(f"end_trees, 3 setsid children: {end_tree_ms(3, a.reps):.2f} ms")
    ms, n = sweep_ms(a.reps)
    print(f"sweep over {n} processes: {ms:.2f} ms")


if __name__ == "__main__":
    main()

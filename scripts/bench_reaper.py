"""What reaping costs (cpsim.run.reaper): ending a worker's tree, and the marker sweep.

    .venv/bin/python scripts/bench_reaper.py [--reps 20]

(1) ``end_trees`` of one process (a stand-in for a worker: what it costs is /proc reads and
    signals, not the process), alone and with 3 setsid'd children, as ``Worker.stop`` pays it
    once per worker stop; median ms.
(2) ``sweep`` (one pass over /proc/*/environ, nothing marked), as paid after each plugin check
    and at the end of each command; median ms, with the number of processes scanned.
(3) The exit path of a command (``isolation._end_groups``: two live workers' trees, the sweep,
    the subreaper's descendants), once.

Measured 2026-12-02 on the shared 2-core x86_64 VM (load 9), Python 3.11.7, ``--reps 15``: end_trees
0.53 ms alone, 8.81 ms with 3 setsid children (waiting for them to stop, then to die); sweep 1.18 ms
over 157 processes; the exit path 24-71 ms (four runs), where the code before (419802f: group kill,
then 20 ms rounds over the descendants) took 73-74 ms. No whole-run change, so nothing in
docs/BENCHMARKS.md.
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


def exit_path_ms() -> float:
    from cpsim.run import isolation, reaper
    reaper.become_subreaper()  # as the CLI is
    workers = [isolation.Worker(), isolation.Worker()]
    for w in workers:
        w.spawn("cpu")
    for w in workers:
        w.ready()
    t = time.perf_counter()
    isolation._end_groups()
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    print(f"end_trees, no children: {end_tree_ms(0, a.reps):.2f} ms")
    print(f"end_trees, 3 setsid children: {end_tree_ms(3, a.reps):.2f} ms")
    ms, n = sweep_ms(a.reps)
    print(f"sweep over {n} processes: {ms:.2f} ms")
    print(f"exit path, two live workers: {exit_path_ms():.1f} ms")


if __name__ == "__main__":
    main()

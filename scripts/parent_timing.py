"""Where the fuzz parent's time goes, with the kernels in their workers: thread CPU time and wall time
per cpsim function, taken with timers around them (not a profiler, which inflates small calls
unevenly). Default-space scenarios, seed 0, the last of several passes reported.

    PYTHONPATH=$PWD python3 scripts/parent_timing.py --device cuda [--examples 150] [--passes 3]
"""
import argparse
import collections
import functools
import tempfile
import time
from pathlib import Path

import torch

T = collections.defaultdict(lambda: [0.0, 0.0, 0])


def wrap(owner, name: str, label: str) -> None:
    f = getattr(owner, name)

    @functools.wraps(f)
    def timed(*a, **k):
        c, w = time.thread_time(), time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            t = T[label]
            t[0] += time.thread_time() - c
            t[1] += time.perf_counter() - w
            t[2] += 1
    setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--examples", type=int, default=150)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import cpsim.fuzz as fz
    from cpsim import allocator
    from cpsim.check import coordinator
    from cpsim.fuzz import space
    from cpsim.run import isolation, world
    if args.device != "cpu":
        from cpsim.run.dist import select_device
        select_device(args.device)
    wrap(fz, "evaluate", "evaluate (all but the search loop)")
    wrap(coordinator, "check", "  coordinator.check")
    wrap(space, "build", "  space.build (drawing)")
    wrap(allocator, "allocate_world", "  allocate_world")
    wrap(isolation, "_start", "  isolation._start (sending)")
    wrap(isolation, "_collect", "  isolation._collect (waiting, receiving)")
    wrap(isolation.Worker, "answer", "    Worker.answer (unpacking)")
    wrap(world, "stack", "  world.stack")
    for p in range(args.passes):
        T.clear()
        cfg = fz.FuzzConfig(max_examples=args.examples, seed=0, database=None, device=args.device,
                            out=Path(tempfile.mkdtemp()))
        c, w = time.thread_time(), time.perf_counter()
        fz.search(cfg)
        c, w = time.thread_time() - c, time.perf_counter() - w
        n = args.examples
        print(f"pass {p + 1}: {n / w:.1f} scenarios/s; parent thread CPU {c / n * 1e3:.3f} ms, wall {w / n * 1e3:.3f} ms "
              f"per scenario", flush=True)
    for label, (cpu, wall, calls) in T.items():
        print(f"  {label:42s} CPU {cpu / n * 1e3:6.3f} ms  wall {wall / n * 1e3:6.3f} ms  ({calls / n:.1f} calls)")


if __name__ == "__main__":
    main()

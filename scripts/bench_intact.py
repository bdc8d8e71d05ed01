"""What the inputs-intact check costs: one rank run of a user's kernel with and without the
copy-and-compare around each launch (``cpsim.paths._intact``), in-process on the kernel's device.

    .venv/bin/python scripts/bench_intact.py [--reps 20] [--device cpu]

For each of a callable (tests/kernels/callable_abi.py) and an ascend-v1 Triton kernel
(tests/kernels/ascend_v1_abi.py, under the interpreter on CPU), on the default preset (8 ranks)
and on long-prefill: the median seconds of one rank run of the v1 path, bracketed and not
(interleaved), and the copy-and-compare alone around a launch that does nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cpsim.allocator import allocate_world  # noqa: E402
from cpsim.kernels.under_test import here, inspect_here, load  # noqa: E402
from cpsim.paths import _intact, run_path  # noqa: E402
from cpsim.presets import preset  # noqa: E402

KERNELS = {"callable": "tests/kernels/callable_abi.py:slot_mapping",
           "ascend-v1 (Triton)": "tests/kernels/ascend_v1_abi.py:_compute_slot_mapping_kernel"}


def time_rank_runs(k, s, allocs, device: str, reps: int) -> tuple[float, float]:
    """Median seconds of one rank run with the bracket on and off, interleaved rep by rep so that
    the load of a shared box falls on both alike."""
    bracket = _intact.bracket
    off_bracket = lambda written, inputs: contextlib.nullcontext()  # noqa: E731
    run_path("v1", s, allocs[0], 0, device, kernel=k)  # warm-up (the interpreter's first launch)
    on, off = [], []
    for i in range(reps):
        r = i % s.cp.world
        for times, b in ((on, bracket), (off, off_bracket)):
            _intact.bracket = b
            t = time.perf_counter()
            run_path("v1", s, allocs[r], r, device, kernel=k)
            times.append(time.perf_counter() - t)
    _intact.bracket = bracket
    return statistics.median(on), statistics.median(off)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    for name in ("default", "long-prefill"):
        print(f"{name:13s} copy-and-compare alone (every group's v1 inputs): "
              f"{bracket_alone(name, args.device, args.reps * 10) * 1e3:.3f} ms")
    for name in ("default", "long-prefill"):
        s = preset(name)
        allocs = allocate_world(s)
        for label, spec in KERNELS.items():
            k = here(load(str(ROOT / spec), "v1", device=args.device, inspect=inspect_here), args.device)
            on, off = time_rank_runs(k, s, allocs, args.device, args.reps)
            print(f"{name:13s} {label:20s} checked {on * 1e3:8.2f} ms  unchecked {off * 1e3:8.2f} ms  "
                  f"cost {(on - off) * 1e3:+7.2f} ms ({(on / off - 1) * 100:+.1f} %)")


def bracket_alone(name: str, device: str, reps: int) -> float:
    """Median seconds of the copy-and-compare alone, around a launch that does nothing, for the
    inputs one v1 launch of every group gets on rank 0 (positions, query_start_loc, the table)."""
    from cpsim.paths import Knobs, v1
    from cpsim.paths.prep import PerRank
    s = preset(name)
    allocs = allocate_world(s)
    prep = PerRank(s, device)
    bt, _ = prep.batch()
    inputs = [(gi, "block table", prep.table(allocs[0][gi], v1.table_shape(s, g, Knobs())))
              for gi, g in enumerate(s.groups)]
    inputs += [(0, "positions", bt.positions), (0, "query_start_loc", bt.query_start_loc)]
    times = []
    for _ in range(reps):
        written = _intact.counts(len(s.groups))
        t = time.perf_counter()
        with _intact.bracket(written, inputs):
            pass
        times.append(time.perf_counter() - t)
    return statistics.median(times)


if __name__ == "__main__":
    main()

"""CPU side of the testbed: coordinator throughput and virtual-world time.

1. ``coordinator.check`` on 8 ranks x 1M tokens x 2 groups. The gathered tensors
   are built from ``cpsim.check.reference.rank_slots`` (what correct kernels return), so
   no kernel runs; the time and the process's peak RSS are the check's.
2. ``run_virtual`` + ``check`` for the ``long-prefill`` preset (8 ranks x 128K
   tokens) with each kernel design, on the Triton interpreter.

    PYTHONPATH=$PWD python scripts/bench_coordinator.py [--tokens 1048576] [--skip-world]

Targets (issue 7): check <= 5 s on 2 cores, peak memory <= 2 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux


def big_scenario(tokens: int):
    from cpsim import scenario as sc

    cp = sc.CPConfig(dcp=8, interleave=16)
    groups = (sc.KVGroup("attn", "attention", 128, num_blocks=tokens // (128 * 8) * 4 + 64),
              sc.KVGroup("attn-hybrid", "attention", 128, 64, num_blocks=tokens // (128 * 8) * 4 + 64))
    per = tokens // 4
    reqs = (sc.Request(0, per, "prefill"), sc.Request(per, per, "chunked"),
            sc.Request(3 * per, per, "chunked"), sc.Request(0, per, "prefill"))
    limits = sc.Limits(max_model_len=4 * per, max_num_reqs=8, max_num_batched_tokens=tokens)
    return sc.validate(sc.Scenario("bench-1M", cp, groups, limits, sc.Batch(reqs, num_tokens_padded=tokens)))


def bench_check(tokens: int) -> dict:
    import torch

    from cpsim.check import coordinator, reference

    from cpsim import layout
    from cpsim.allocator import allocate_world
    from cpsim.check.gathered import Gathered

    s = big_scenario(tokens)
    allocs = allocate_world(s)
    R, G = s.cp.world, len(s.groups)
    T = s.limits.slot_buffer_size
    slots = torch.stack([reference.rank_slots(s, allocs[r], r, T) for r in range(R)])
    widths = torch.tensor([[layout.table_width(s.limits.max_model_len, g.block_size, g.world(s.cp))
                            for g in s.groups]] * R)
    sizes = torch.tensor([[g.block_size for g in s.groups]] * R)
    gathered = {"v2": Gathered("v2", slots, torch.ones(R, G, dtype=torch.bool), widths, sizes)}
    before = rss_gib()
    t0 = time.perf_counter()
    verdicts = coordinator.check(s, allocs, gathered, [s.fingerprint()] * R)
    dt = time.perf_counter() - t0
    bad = [(v.invariant, v.path) for v in verdicts if v.status == "fail"]
    # A planted fault must still be found at this size: one slot moved on rank 5.
    slots[5, 0, tokens // 2] += 1
    t1 = time.perf_counter()
    caught = {v.invariant for v in coordinator.check(s, allocs, gathered, [s.fingerprint()] * R)
              if v.status == "fail"}
    dt_fault = time.perf_counter() - t1
    return {"tokens": s.batch.num_tokens, "ranks": R, "groups": G, "check_s": round(dt, 3),
            "check_with_fault_s": round(dt_fault, 3), "fault_caught": sorted(caught),
            "peak_rss_gib": round(rss_gib(), 3), "rss_before_check_gib": round(before, 3),
            "failures_on_correct_input": bad}


def bench_world() -> list[dict]:
    from cpsim.kernels import use_interpreter

    use_interpreter()
    from cpsim.check import coordinator
    from cpsim.presets import preset
    from cpsim.allocator import allocate_world
    from cpsim.paths import PATHS, Knobs
    from cpsim.run.world import run_virtual

    s = preset("long-prefill")
    rows = []
    for design in ("per-request", "tile"):
        t0 = time.perf_counter()
        g = run_virtual(s, list(PATHS), Knobs(kernel_design=design))
        t1 = time.perf_counter()
        v = coordinator.check(s, allocate_world(s), g, [s.fingerprint()] * s.cp.world)
        t2 = time.perf_counter()
        rows.append({"preset": "long-prefill", "kernel_design": design, "paths": sorted(g),
                     "run_virtual_s": round(t1 - t0, 2), "check_s": round(t2 - t1, 2),
                     "passed": coordinator.passed(v)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--skip-world", action="store_true", help="only the coordinator check")
    ap.add_argument("--out", help="write the numbers as JSON here")
    args = ap.parse_args()
    import torch

    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(), "command": " ".join(sys.argv)}
    res = {"meta": meta, "check": bench_check(args.tokens)}
    print(json.dumps(res["check"]), flush=True)
    if not args.skip_world:
        res["world"] = bench_world()
        for r in res["world"]:
            print(json.dumps(r), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    ok = not res["check"]["failures_on_correct_input"] and res["check"]["fault_caught"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

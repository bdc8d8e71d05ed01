"""Benchmark: load and check a captured step of 1M tokens, 8 ranks, 4 groups (issue 14 target: <= 10 s on 2 cores).

The capture files are written in the exact format the recorder writes for a
v2-family launch (one ``rank<R>.cpcap`` per rank, one record per launch), with
tables from cpsim's allocator and slot mappings from cpsim's reference: running
the Triton interpreter over 8M token-rank pairs would take far longer than the
thing measured. ``--plant`` writes one wrong slot on one rank to show the check
still finds it at this size.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_capture.py [--tokens 1048576 --ranks 8 --groups 4] [--plant]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def build(directory: Path, tokens: int, ranks: int, groups: int, plant: bool) -> dict:
    from cpsim.allocator import allocate_world, physical_table
    from cpsim.capture.recorder import Policy, Recorder
    from cpsim.check import reference
    from cpsim import layout
    from cpsim.scenario import Batch, CPConfig, KVGroup, Limits, Request, Scenario

    sizes = [(128, 64), (16, 16), (64, 64), (256, 128)][:groups]
    gs = tuple(KVGroup(f"attn{i}", "attention", B, b if b != B else 0,
                       num_blocks=2 * layout.cdiv(tokens, B * ranks) + 8) for i, (B, b) in enumerate(sizes))
    s = Scenario("bench-capture", CPConfig(dcp=ranks, interleave=16), gs,
                 Limits(max_model_len=tokens, max_num_reqs=1, max_num_batched_tokens=tokens),
                 Batch((Request(0, tokens, "prefill"),)))
    allocs = allocate_world(s)
    T = s.limits.slot_buffer_size
    rec = Recorder(directory, Policy(budget=1 << 40))
    qsl = np.array([0, tokens], dtype=np.int32)
    pos = np.arange(tokens, dtype=np.int64)
    for r in range(ranks):
        slots = reference.rank_slots(s, allocs[r], r, T).numpy()
        if plant and r == ranks // 2:
            slots[0, tokens // 3] += 1
        tables = {f"table{gi}": physical_table(allocs[r][gi], [0], 1, layout.table_width(tokens, g.block_size, ranks))
                  .numpy() for gi, g in enumerate(gs)}
        arrays = {"idx_mapping": np.zeros(1, np.int32), "query_start_loc": qsl, "pos": pos,
                  "block_table_ptrs": np.zeros(groups, np.int64),
                  "block_table_strides": np.array([t.shape[1] for t in tables.values()], np.int64),
                  "block_sizes": np.array([g.block_size for g in gs], np.int32),
                  "slot_mappings_ptr": slots, "slot_mapping_enabled": np.ones(groups, np.int32),
                  "group_cp_sizes": np.full(groups, ranks, np.int32), "is_circular": np.zeros(groups, np.int32),
                  **tables}
        meta = {"kernel": "bench:v2", "family": "v2", "grid": [groups, 2], "step": 0, "call": 0, "rank": r,
                "scalars": {"max_num_tokens": T, "num_tokens": tokens, "cp_rank": r, "CP_SIZE": ranks,
                            "CP_INTERLEAVE": 16, "PAD_ID": -1, "slot_mappings_stride": T}}
        rec.write(r, 0, 0, meta, arrays)
    return {"bytes": sum(p.stat().st_size for p in directory.iterdir())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1 << 20)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--plant", action="store_true", help="one wrong slot on one rank")
    p.add_argument("--dir", help="where to write the capture (default: a temporary directory)")
    p.add_argument("--out", help="write the numbers as JSON")
    p.add_argument("--reuse", action="store_true", help="--dir already holds the capture: only load and check")
    args = p.parse_args()
    d = Path(args.dir or tempfile.mkdtemp(prefix="cpsim-bench-capture-"))
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info = ({"bytes": sum(f.stat().st_size for f in d.iterdir())} if args.reuse
            else build(d, args.tokens, args.ranks, args.groups, args.plant))
    t_build = time.perf_counter() - t0

    from cpsim.capture import load
    from cpsim.capture.steps import check_step
    import os

    import torch
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # as `cpsim replay` does for captures
    t0, c0 = time.perf_counter(), time.process_time()
    steps = list(load.steps(d))
    t_load, c_load = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    outs = [check_step(s) for s in steps]
    t_check, c_check = time.perf_counter() - t0, time.process_time() - c0
    failed = sorted({i for o in outs for i in o.invariants()})
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t0 = time.perf_counter()
    cli = subprocess.run([sys.executable, "-m", "cpsim", "replay", str(d), "--quiet"], capture_output=True, text=True)
    t_cli = time.perf_counter() - t0
    res = {"tokens": args.tokens, "ranks": args.ranks, "groups": args.groups, "capture_bytes": info["bytes"],
           "write_s": round(t_build, 2), "load_s": round(t_load, 2), "check_s": round(t_check, 2),
           "load_plus_check_s": round(t_load + t_check, 2), "load_cpu_s": round(c_load, 2),
           "check_cpu_s": round(c_check, 2), "torch_threads": torch.get_num_threads(), "peak_rss_gib": round(rss, 2),
           "cli_replay_wall_s": round(t_cli, 2), "cli_exit": cli.returncode, "failed": failed, "planted": args.plant}
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    expected = 1 if args.plant else 0
    return 0 if cli.returncode == expected and bool(failed) == args.plant else 1


if __name__ == "__main__":
    sys.exit(main())

"""Throughput of the virtual world as `cpsim fuzz` drives it: scenarios per second.

Two workloads, each through the Triton interpreter (paths v1,v2) and through the
torch paths only (v1-torch):
  * fuzz: the scenarios `cpsim fuzz` draws by default (Hypothesis, seed 0, no
    fault, no database), strategy + virtual world + coordinator included;
  * small: fixed small shapes (CP world x groups x requests, one decode token
    each), virtual world + coordinator only.
Rates are given per CPU second of this process (what one idle core would do) and
per wall second (what this machine did while it ran, other load included).
Issue 15 adds (``--issue15``): the default space with one job and with ``--jobs 2``
(wall rate, worker start-up included), and the time until a kernel with two
independent bugs (tests/kernels/two_bugs_v1.py) has both reported (search,
shrink and repro files).

    PYTHONPATH=$PWD python scripts/bench_fuzz.py [--examples 200] [--json FILE]
    PYTHONPATH=$PWD python scripts/bench_fuzz.py --issue15 --examples 400
    PYTHONPATH=$PWD python scripts/bench_fuzz.py --issue15-device cuda --examples 3000   # on the GPU
    PYTHONPATH=$PWD python scripts/bench_fuzz.py --issue15-device cuda --examples 300 --passes 3 [--profile F]
    PYTHONPATH=$PWD python scripts/bench_fuzz.py --draws --examples 1000   # drawing alone, both explorers
    PYTHONPATH=$PWD python scripts/bench_fuzz.py --time-to-find [FAULT ...] [--seeds 0,1,2] [--jobs 2]
    PYTHONPATH=$PWD python scripts/bench_fuzz.py --time-to-find --sizing tests/sizing/no_draft_reserve.py:sizing
    PYTHONPATH=$PWD python scripts/bench_fuzz.py --sizing-cost tests/sizing/ascend_shape.py:sizing --examples 1000
    PYTHONPATH=$PWD python scripts/bench_fuzz.py --time-to-find --kernel-v1 tests/kernels/int32_slots.py:slot_mapping
    PYTHONPATH=$PWD python scripts/bench_fuzz.py --rate 0,1,2 --examples 300     # default-space scenarios/s
    PYTHONPATH=$PWD python scripts/bench_fuzz.py --wide-slots 0,1,2 --examples 100  # slots past 2^31: cost
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import sys  # noqa: E402

# The interpreter on CPU; compiled kernels for --issue15-device cuda|npu (Triton reads this at import).
_dev = sys.argv[sys.argv.index("--issue15-device") + 1] if "--issue15-device" in sys.argv[:-1] else "cpu"
if _dev == "cpu":
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


def bench_issue15(examples: int, device: str = "cpu", explore: str = "random") -> list[dict]:
    """Default-space throughput (1 job, and 2 jobs on CPU) and time-to-two-bugs."""
    import tempfile
    from pathlib import Path

    out = []
    jobs = (1, 2) if device == "cpu" else (1,)
    for n in jobs:
        cfg = fz.FuzzConfig(max_examples=examples, seed=0, database=None, jobs=n, device=device,
                            out=Path(tempfile.mkdtemp()), explore=explore)
        c, w = time.process_time(), time.perf_counter()
        r = fz.search(cfg) if n == 1 else fz.search_jobs(cfg)
        c, w = time.process_time() - c, time.perf_counter() - w
        out.append({"workload": f"fuzz default space, {n} job(s), {device}", "explore": explore, "examples": r.examples,
                    "violations": len(r.reported), "wall_per_s": r.examples / w,
                    "cpu_per_s": r.examples / c if n == 1 else None})
        print(f"default space, {n} job(s) on {device}: {r.examples} examples, {r.examples / w:.1f}/s wall"
              + (f", {r.examples / c:.1f}/s per CPU second" if n == 1 else ""), flush=True)
    if device == "cpu":
        from cpsim.kernels.under_test import load
        from cpsim.run.runner import KernelRunner
        root = Path(__file__).resolve().parents[1]
        runner = KernelRunner()
        k = {"v1": load(str(root / "tests/kernels/two_bugs_v1.py") + ":_compute_slot_mapping_kernel", "v1",
                        inspect=runner.probe)}
        cfg = fz.FuzzConfig(paths=["v1"], kernels=k, max_examples=400, seed=0, database=None,
                            shrink_seconds=15, out=Path(tempfile.mkdtemp()), explore=explore)
        w = time.perf_counter()
        r = fz.search(cfg, runner=runner)
        fz.write_findings(cfg, r)
        w = time.perf_counter() - w
        dims = sorted(f.dimension for f in r.reported)
        out.append({"workload": "two independent bugs (two_bugs_v1.py, --paths v1, seed 0, 400 examples)",
                    "seconds": w, "signatures": [f.signature for f in r.reported]})
        print(f"two-bug kernel: {len(r.reported)} signature(s) {dims} reported after {w:.1f} s "
              f"({r.examples} scenarios incl. shrinking)", flush=True)
    return out


def past_2_24(s: sc.Scenario) -> bool:
    """Some rank's allocation puts a kernel-block id past 2^24 in use (where float32 ids go wrong)."""
    for row in allocate_world(s):
        for g, a in zip(s.groups, row):
            if g.slot_mapped and any(len(b) and int(b.max()) * g.bpk > 2**24 for b in a.blocks):
                return True
    return False


def bench_draws(n: int) -> list[dict]:
    """Drawing alone (no kernels, no checks): Hypothesis over ``fz.scenarios()`` and the random explorer;
    then how many of the first ``n`` scenarios of each put a block id past 2^24 in use (not timed)."""
    import random

    from hypothesis import HealthCheck, Phase, given, seed, settings
    from cpsim.fuzz import explore, space

    count = [0]
    drawn: list[sc.Scenario] = []

    def body(s):
        count[0] += 1
        drawn.append(s)

    test = seed(0)(settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
                            suppress_health_check=list(HealthCheck))(given(fz.scenarios())(body)))
    w = time.perf_counter()
    test()
    hyp = (time.perf_counter() - w) / count[0]
    rng, recent, mine = random.Random(0), {}, []
    w = time.perf_counter()
    for i in range(n):
        d = space.RandomDraw(rng, explore.prefix(rng, recent))
        mine.append(space.build(d))
        recent[i % explore.RECENT] = d.choices
    rnd = (time.perf_counter() - w) / n
    reach = {"hypothesis": sum(map(past_2_24, drawn)), "random": sum(map(past_2_24, mine))}
    print(f"drawing one scenario: Hypothesis {hyp * 1e3:.2f} ms, random explorer {rnd * 1e3:.2f} ms", flush=True)
    print(f"block ids past 2^24 in use: Hypothesis {reach['hypothesis']} of {len(drawn)}, "
          f"random explorer {reach['random']} of {n}", flush=True)
    return [{"workload": "draw one scenario", "hypothesis_ms": hyp * 1e3, "random_ms": rnd * 1e3, "n": n,
             "past_2_24": reach}]


# The issue-28 bug classes cpsim's own kernels carry as faults (cpsim/faults/catalogue.py).
TIME_TO_FIND = ("virtual-block-uses-kernel-block", "fixed-table-window", "fp32-block-gather", "int32-slot-overflow",
                "cp-applied-to-unsharded-groups", "stale-tail", "padded-count-tail", "virtual-block-uses-world-size",
                "mtp-draft-capacity", "mamba-sized-per-cp")


def bench_time_to_find(faults: list[str], seeds: list[int], jobs: int, minutes: float, space: str,
                       sizing: bool = False, kernel: str | None = None) -> list[dict]:
    """Seconds from the start of ``cpsim fuzz --inject X`` (default paths v1,v2; ``jobs`` workers, worker
    start-up included) until the first job reports a signature; then the search stops (``stop_after_first``,
    5 s of shrinking). ``None``: not found within ``minutes``. ``sizing``: each X is a ``--sizing SPEC``
    (a buggy host sizing twin) instead, with no fault injected; its child start-up is included.
    ``kernel``: instead of the faults, the fault-free search of ``cpsim fuzz --paths v1 --kernel-v1
    KERNEL`` (a buggy kernel of our own)."""
    import tempfile
    from pathlib import Path

    from cpsim.kernels.under_test import load
    from cpsim.run.runner import KernelRunner
    runner = KernelRunner()
    rows = []
    for name in ([kernel] if kernel else faults):
        for s in seeds:
            first = [None]
            started = time.monotonic()

            def seen(status, first=first, started=started):
                if first[0] is None and any(v[1] for v in status.values()):
                    first[0] = time.monotonic() - started

            def seen1(prog, first=first, started=started):
                if first[0] is None and prog.signatures:
                    first[0] = time.monotonic() - started

            how = ({"paths": ["v1"], "kernels": {"v1": load(kernel, "v1", inspect=runner.probe)}} if kernel else
                   {"sizing": name} if sizing else {"inject": name})
            cfg = fz.FuzzConfig(**how, minutes=minutes, max_examples=10**9, seed=s, database=None, jobs=jobs,
                                stop_after_first=True, shrink_seconds=5, space=space, out=Path(tempfile.mkdtemp()))
            r = fz.search_jobs(cfg, seen) if jobs > 1 else fz.search(cfg, seen1)
            sig = r.reported[0].signature if r.found else None
            key = "kernel_v1" if kernel else "sizing" if sizing else "fault"
            rows.append({key: name, "seed": s, "jobs": jobs, "space": space, "seconds_to_find": first[0],
                         "examples_total": r.examples, "signature": sig})
            print(f"{name:34s} seed {s}: " + (f"found after {first[0]:.1f} s ({sig})" if first[0] is not None
                                               else f"not found in {minutes:g} min ({r.examples} examples)"),
                  flush=True)
    return rows


def bench_sizing_cost(spec: str, n: int) -> list[dict]:
    """What `cpsim fuzz --sizing SPEC` pays per scenario for the sizing child's answer: ``n`` default-space
    draws, each asked once (every host input new, so no answer comes from the memo), after the child
    started; then the same ``n`` again (every answer from the memo). Child start-up timed on its own."""
    import random

    from cpsim.fuzz import space
    from cpsim.run.host_sizer import Sizer

    rng = random.Random(0)
    drawn = [space.build(space.RandomDraw(rng)) for _ in range(n)]
    with Sizer(spec) as z:
        w = time.perf_counter()
        z.check()
        start = time.perf_counter() - w
        w = time.perf_counter()
        for s in drawn:
            z.answer(s, ["v1", "v2"])
        cold = (time.perf_counter() - w) / n
        asked = len(z._memo)
        w = time.perf_counter()
        for s in drawn:
            z.answer(s, ["v1", "v2"])
        warm = (time.perf_counter() - w) / n
    print(f"sizing child start-up {start:.2f} s; per scenario {cold * 1e3:.3f} ms asked ({asked} distinct inputs), "
          f"{warm * 1e3:.3f} ms from the memo", flush=True)
    return [{"workload": f"--sizing {spec}, paths v1,v2, {n} default-space scenarios", "child_start_s": start,
             "ms_per_scenario_asked": cold * 1e3, "distinct_inputs": asked, "ms_per_scenario_memo": warm * 1e3}]


def bench_rate(examples: int, seeds: list[int]) -> list[dict]:
    """Scenarios/s of the default space (1 job, no fault, the kernel workers included) per seed. Run it
    with PYTHONPATH on two trees, alternately, to compare a change of the space (cpsim/fuzz/space.py)."""
    import tempfile
    from pathlib import Path

    rows = []
    for s in seeds:
        cfg = fz.FuzzConfig(max_examples=examples, seed=s, database=None, out=Path(tempfile.mkdtemp()))
        w = time.perf_counter()
        r = fz.search(cfg)
        w = time.perf_counter() - w
        rows.append({"workload": "fuzz default space, 1 job", "cpsim": os.path.dirname(fz.__file__), "seed": s,
                     "examples": r.examples, "wall_s": w, "wall_per_s": r.examples / w,
                     "violations": len(r.reported), "load_avg": os.getloadavg()[0]})
        print(f"seed {s}: {r.examples} examples, {r.examples / w:.1f}/s wall, {len(r.reported)} violation(s), "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    return rows


def bench_wide_slots(n: int, seed: int) -> list[dict]:
    """What the default space's caches with slots past 2^31 cost: ``n`` such scenarios of the random explorer
    (seed ``seed``), each run (paths v1,v2, kernel workers) as drawn and with its caches cut to the int32 rule
    (``space.cache_cap(g, "default", int32_slots=True)``), alternately; the rest of the scenario is the same."""
    import dataclasses
    import random

    from cpsim.fuzz import space
    rng = random.Random(seed)
    wide = []
    while len(wide) < n:
        s = space.build(space.RandomDraw(rng))
        if any(g.slot_mapped and g.num_blocks * g.block_size > 2**31 for g in s.groups):
            wide.append(s)

    def cut(s: sc.Scenario) -> sc.Scenario:
        return sc.validate(s.replace(groups=tuple(dataclasses.replace(g, num_blocks=max(
            2, sc.max_blocks_needed(s, g) + 1, min(g.num_blocks, space.cache_cap(g, "default", True))))
            for g in s.groups)))

    pairs = [(s, cut(s)) for s in wide]
    fz.evaluate(wide[0], ["v1", "v2"])  # kernel-worker start-up, not counted
    spent, failed = {"as drawn": 0.0, "cut": 0.0}, {"as drawn": 0, "cut": 0}
    for i, (a, b) in enumerate(pairs):
        for name, s in (("as drawn", a), ("cut", b))[:: 1 if i % 2 == 0 else -1]:
            w = time.perf_counter()
            failed[name] += fz.evaluate(s, ["v1", "v2"]).failed
            spent[name] += time.perf_counter() - w
    row = {"workload": "default-space scenarios with slots past 2^31: as drawn vs caches cut below 2^31",
           "seed": seed, "scenarios": n, "ms_as_drawn": spent["as drawn"] / n * 1e3, "ms_cut": spent["cut"] / n * 1e3,
           "failed": failed, "load_avg": os.getloadavg()[0]}
    print(f"seed {seed}: {n} scenarios, {row['ms_as_drawn']:.1f} ms as drawn, {row['ms_cut']:.1f} ms cut below 2^31; "
          f"failed {failed}", flush=True)
    return [row]


def kernel_variants() -> int | None:
    """Compiled variants (one per constexpr set and signature) Triton holds in memory, all kernels."""
    import importlib
    total = 0
    for mod in ("triton_v1", "triton_v2", "mrv2", "replay_pad", "tile_v1", "tile_v2"):
        try:
            m = importlib.import_module(f"cpsim.kernels.{mod}")
        except Exception:  # noqa: BLE001  (a module the device cannot import: not counted)
            continue
        for fn in vars(m).values():
            caches = getattr(fn, "device_caches", None)
            if isinstance(caches, dict):
                total += sum(len(c[0]) for c in caches.values())
    return total


def bench_device_passes(examples: int, device: str, passes: int, profile: str | None,
                        explore: str = "random") -> list[dict]:
    """The default space on a compiled device, the same seed ``passes`` times in one process: the first
    pass compiles (or loads from Triton's disk cache) one kernel per new constexpr set, later passes find
    every kernel in memory, i.e. the steady state of a long run. ``profile``: cProfile the last pass."""
    import cProfile
    import io
    import pstats
    import tempfile
    from pathlib import Path

    from cpsim.run.runner import KernelRunner
    from cpsim.run.boot import pool_size
    runner = KernelRunner()  # one for every pass: its workers stay warm, as in one long fuzz run
    out = []
    for k in range(passes):
        cfg = fz.FuzzConfig(max_examples=examples, seed=0, database=None, device=device, out=Path(tempfile.mkdtemp()),
                            explore=explore)
        prof = cProfile.Profile() if profile and k == passes - 1 else None
        c, w = time.process_time(), time.perf_counter()
        if prof:
            prof.enable()
        r = fz.search(cfg, runner=runner)
        if prof:
            prof.disable()
        c, w = time.process_time() - c, time.perf_counter() - w
        variants = None if runner.config.process else kernel_variants()
        row = {"workload": f"fuzz default space, 1 job, {device}, pass {k + 1} of {passes}", "explore": explore,
               "isolation_worker": runner.config.process,
               "kernel_workers": pool_size(device) if runner.config.process else 0,
               "examples": r.examples, "wall_per_s": r.examples / w,
               "cpu_per_s_this_process": r.examples / c, "kernel_variants_in_memory": variants,
               "profiled": prof is not None}
        out.append(row)
        print(f"pass {k + 1}: {r.examples} examples, {r.examples / w:.1f}/s wall, {r.examples / c:.1f}/s per CPU "
              f"second of this process" + (f", {variants} kernel variants in memory" if variants else "")
              + (" (profiled)" if prof else ""), flush=True)
        if prof:
            text = io.StringIO()
            st = pstats.Stats(prof, stream=text)
            st.sort_stats("cumulative").print_stats(60)
            st.sort_stats("tottime").print_stats(40)
            Path(profile).write_text(text.getvalue())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("--issue15", action="store_true", help="only the issue-15 rows (jobs, two bugs)")
    ap.add_argument("--issue15-device", metavar="DEV", help="only the default-space row, on this device")
    ap.add_argument("--passes", type=int, default=0,
                    help="with --issue15-device: the same seed this many times in one process (steady state)")
    ap.add_argument("--profile", metavar="FILE", help="with --passes: cProfile text of the last pass")
    ap.add_argument("--explore", default="random", choices=fz.EXPLORERS, help="as cpsim fuzz --explore")
    ap.add_argument("--draws", action="store_true", help="only the cost of drawing scenarios (--examples of them)")
    ap.add_argument("--time-to-find", nargs="*", metavar="FAULT",
                    help="seconds until `cpsim fuzz --inject FAULT` reports it (default: the issue-28 faults)")
    ap.add_argument("--seeds", default="0,1,2", help="with --time-to-find: comma-separated seeds")
    ap.add_argument("--jobs", type=int, default=1, help="with --time-to-find: fuzz jobs (1: what `cpsim fuzz` runs)")
    ap.add_argument("--minutes", type=float, default=2.0, help="with --time-to-find: give up after this long")
    ap.add_argument("--space", default="default", choices=tuple(fz.SPACES), help="with --time-to-find")
    ap.add_argument("--sizing-cost", metavar="SPEC", help="only the sizing child's cost per scenario (--examples)")
    ap.add_argument("--sizing", metavar="SPEC,...", help="with --time-to-find: time `cpsim fuzz --sizing SPEC` for "
                                                       "each SPEC (buggy host sizing twins) instead of faults")
    ap.add_argument("--kernel-v1", metavar="SPEC",
                    help="with --time-to-find: fuzz this kernel on path v1 instead of injecting faults")
    ap.add_argument("--rate", metavar="SEEDS", help="only the default space's scenarios/s for these seeds (--examples)")
    ap.add_argument("--wide-slots", metavar="SEEDS",
                    help="only the cost of caches with slots past 2^31 (--examples scenarios per seed)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as `cpsim fuzz` does
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}, "
                      f"torch {torch.__version__}",
           "load_avg_start": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M"), "results": []}
    if args.time_to_find is not None:
        what = args.sizing.split(",") if args.sizing else (args.time_to_find or list(TIME_TO_FIND))
        out["results"] = bench_time_to_find(what, [int(x) for x in args.seeds.split(",")], args.jobs, args.minutes,
                                            args.space, sizing=bool(args.sizing), kernel=args.kernel_v1)
        out["load_avg_end"] = os.getloadavg()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
        return
    if args.sizing_cost:
        out["results"] = bench_sizing_cost(args.sizing_cost, args.examples)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
        return
    if args.rate or args.wide_slots:
        seeds = [int(x) for x in (args.rate or args.wide_slots).split(",")]
        out["results"] = (bench_rate(args.examples, seeds) if args.rate else
                          [r for s in seeds for r in bench_wide_slots(args.examples, s)])
        out["load_avg_end"] = os.getloadavg()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
        return
    if args.draws:
        out["results"] = bench_draws(args.examples)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
        return
    if args.issue15 or args.issue15_device:
        if args.issue15_device and args.issue15_device != "cpu":
            from cpsim.run.dist import select_device
            select_device(args.issue15_device)
        if args.passes:
            out["results"] = bench_device_passes(args.examples, args.issue15_device or "cpu", args.passes,
                                                 args.profile, args.explore)
        else:
            out["results"] = bench_issue15(args.examples, args.issue15_device or "cpu", args.explore)
        out["load_avg_end"] = os.getloadavg()
        print(f"load average {out['load_avg_start'][0]:.1f} -> {out['load_avg_end'][0]:.1f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
        return
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

"""The fuzz parent's CPU per scenario under the CUDA-fuzz settings, on a machine without a GPU.

What the H200's fuzz parent does per scenario (draw, allocate, send to the kernel workers, receive,
unpack, stack, coordinator, signature bookkeeping, the search loop) is device-independent: the
kernels run in the workers. So this runs the real search (``cpsim.fuzz.search``, seed 0, the
default space, ``device="cuda"``: four workers, whole paths per worker, two scenarios run ahead)
against fake kernel workers that answer each rank run with the output cpsim's own kernels gave on
CPU, recorded once beforehand (Triton interpreter, in-process, not timed). The workers speak the
real protocol (``cpsim.run.kernel_worker``), so the parent's side is the one under test; their own
CPU is not counted: the parent's thread CPU time is (``time.thread_time``), so a loaded box adds
little noise. ``--pieces`` adds per-function timers (as ``scripts/parent_timing.py``; they cost
a little themselves); ``--profile F`` writes cProfile text of the last pass.

    PYTHONPATH=$PWD python scripts/bench_parent.py [--examples 600] [--passes 4] [--pieces] [--json F]
    BENCH_PARENT_FINE=1 ... --pieces   # the send and receive path in finer pieces

Compare two trees by running this file with each on PYTHONPATH (the recording is shared: /tmp).
"""

from __future__ import annotations

import argparse
import collections
import functools
import hashlib
import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
T = collections.defaultdict(lambda: [0.0, 0])


# ---- the fake kernel worker (a child process) ----------------------------------------

def fake_main(fd: int, parent_pid: int, authkey: str) -> None:
    """``kernel_worker.main`` with rank runs answered from the recording (``CPSIM_BENCH_REPLIES``);
    a scenario not in it runs for real, on CPU (slow, and said on stderr)."""
    import multiprocessing
    import signal
    from multiprocessing.connection import Connection
    from cpsim.run import kernel_worker as kw
    from cpsim.run import wire
    multiprocessing.current_process().authkey = bytes.fromhex(authkey)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(os.environ["CPSIM_BENCH_REPLIES"], "rb") as f:
        replies = pickle.load(f)
    conn = Connection(fd)
    kernels: dict = {}
    loaded: tuple = (None, None, {})
    prepared = False
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "prepare":
            kw._send(conn, wire.Ready())
        elif msg[0] == "load":
            loaded = msg[1:]
        elif msg[0] == "run_ranks":
            path, token, ranks, device, knobs, record, batch = msg[1:]
            got = replies.get((loaded[1].fingerprint(), path))
            if got is not None and batch and loaded[0] == token:
                kw._send(conn, wire.Batch([wire.RankDone(path, r, got[r], []) for r in ranks]))
                continue
            print(f"bench_parent: scenario {loaded[1].fingerprint()} path {path} not recorded: run on CPU",
                  file=sys.stderr, flush=True)
            if not prepared:
                kw._prepare("cpu", 1)
                prepared = True
            kw._run_ranks(conn, kernels, loaded, path, token, ranks, "cpu", knobs, record, batch)
        else:
            kw._send(conn, wire.Raised("RuntimeError", f"bench_parent fake worker: no {msg[0]!r}"))


# ---- recording the kernels' outputs (not timed) -------------------------------------------

def record(examples: int, dest: Path) -> None:
    """Run the same search in-process on CPU (the interpreter) and keep every rank run's packed output."""
    os.environ["TRITON_INTERPRET"] = "1"
    import cpsim.fuzz as fz
    from cpsim.run import isolation, kernel_worker, world
    isolation.configure(process=False)
    out: dict = {}
    real = world.run_paths

    def keep(s, paths, *a, **k):
        got = real(s, paths, *a, **k)
        for p in paths:
            if isinstance(got[p], list):
                out[(s.fingerprint(), p)] = [kernel_worker.pack(o) for o in got[p]]
        return got
    world.run_paths = keep
    fz.search(fz.FuzzConfig(max_examples=examples, seed=0, database=None, device="cpu",
                            out=Path(tempfile.mkdtemp())))
    world.run_paths = real
    isolation.configure(process=True)
    tmp = dest.with_suffix(".part")
    with open(tmp, "wb") as f:
        pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(dest)


# ---- timing --------------------------------------------------------------------------

def wrap(owner, name: str, label: str) -> None:
    f = getattr(owner, name)

    @functools.wraps(f)
    def timed(*a, **k):
        c = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            t = T[label]
            t[0] += time.thread_time() - c
            t[1] += 1
    setattr(owner, name, timed)


def pieces() -> None:
    import cpsim.fuzz as fz
    from cpsim import allocator
    from cpsim.check import coordinator
    from cpsim.fuzz import space
    from cpsim.run import isolation, world
    wrap(fz, "evaluate", "evaluate (all but drawing and the search loop)")
    wrap(space, "build", "  space.build (drawing)")
    wrap(allocator, "allocate_world", "  allocate_world")
    wrap(isolation, "_start", "  isolation._start (packing, sending)")
    wrap(isolation, "_collect", "  isolation._collect (receiving, unpacking)")
    wrap(isolation.Worker, "answer", "    Worker.answer (unpacking)")
    wrap(world, "stack", "  world.stack")
    wrap(coordinator, "check", "  coordinator.check")
    if os.environ.get("BENCH_PARENT_FINE"):  # the send and receive path in finer pieces (more timer cost)
        from multiprocessing import connection
        from cpsim.run import kernel_worker
        wrap(isolation, "_send", "    _send")
        wrap(isolation, "_load_message", "      _load_message (pickling)")
        wrap(connection.Connection, "send", "      Connection.send (pickling, write)")
        wrap(connection.Connection, "send_bytes", "      Connection.send_bytes (write)")
        wrap(connection.Connection, "recv", "    Connection.recv (read, unpickling)")
        wrap(isolation, "_readable", "    _readable (poll)")
        wrap(kernel_worker, "unpack", "    kernel_worker.unpack")
        wrap(isolation.Worker, "alive", "    Worker.alive")


def summary(r) -> str:
    """What must not change between trees: every finding's signature, where it was first seen, its
    scenario; the counts."""
    rows = [[f.signature, f.first_seen, f.scenario.fingerprint(), f.summary] for f in r.findings]
    return json.dumps({"examples": r.examples, "classify_runs": r.classify_runs,
                       "not_expressible": r.not_expressible, "findings": rows}, sort_keys=True, default=str)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=600)
    ap.add_argument("--passes", type=int, default=4, help="the same seed this often (pass 1: warm-up)")
    ap.add_argument("--pieces", action="store_true", help="per-function thread CPU (timers cost a little)")
    ap.add_argument("--profile", metavar="FILE", help="cProfile text of the last pass")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--recording", metavar="FILE", help="default: /tmp/cpsim-bench-parent-<examples>.pkl")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)  # as `cpsim fuzz` does
    rec = Path(args.recording or f"/tmp/cpsim-bench-parent-{args.examples}.pkl")
    if not rec.exists():
        print(f"recording kernel outputs of {args.examples} scenarios to {rec} (interpreter, once)", flush=True)
        record(args.examples, rec)
    os.environ["CPSIM_BENCH_REPLIES"] = str(rec)
    import cpsim
    import cpsim.fuzz as fz
    from cpsim.run import isolation
    isolation._BOOT = (f"import sys; sys.path[0] = sys.argv[1]; sys.path.insert(1, {str(HERE)!r}); "
                       "from bench_parent import fake_main; fake_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])")
    if args.pieces:
        pieces()
    tree = str(Path(cpsim.__file__).resolve().parents[1])
    rows, digest = [], None
    for k in range(args.passes):
        T.clear()
        cfg = fz.FuzzConfig(max_examples=args.examples, seed=0, database=None, device="cuda",
                            out=Path(tempfile.mkdtemp()))
        prof = None
        if args.profile and k == args.passes - 1:
            import cProfile
            prof = cProfile.Profile(time.thread_time)  # CPU, not wall: the box is shared
            prof.enable()
        c, w = time.thread_time(), time.perf_counter()
        r = fz.search(cfg)
        c, w = time.thread_time() - c, time.perf_counter() - w
        if prof:
            prof.disable()
            import io
            import pstats
            text = io.StringIO()
            st = pstats.Stats(prof, stream=text)
            st.sort_stats("tottime").print_stats(45)
            st.sort_stats("cumulative").print_stats(60)
            st.print_callees("_start|_send|_collect|_finish|stack|check")
            Path(args.profile).write_text(text.getvalue())
        n = r.examples
        d = hashlib.sha256(summary(r).encode()).hexdigest()[:16]
        if digest is not None and d != digest:
            raise SystemExit(f"pass {k + 1} found other findings than pass 1 ({d} != {digest})")
        digest = d
        row = {"pass": k + 1, "examples": n, "parent_cpu_ms": c / n * 1e3, "wall_ms": w / n * 1e3,
               "findings": len(r.findings), "summary_sha": d,
               "pieces_ms": {label.strip(): v[0] / n * 1e3 for label, v in T.items()}}
        rows.append(row)
        print(f"pass {k + 1}: {n} scenarios, parent thread CPU {row['parent_cpu_ms']:.3f} ms/scenario, wall "
              f"{row['wall_ms']:.3f} ms{' (profiled)' if prof else ''}; {len(r.findings)} finding(s), summary {d}",
              flush=True)
        for label, (cpu, calls) in T.items():
            print(f"    {label:48s} CPU {cpu / n * 1e3:6.3f} ms  ({calls / n:.1f} calls)")
    steady = [x["parent_cpu_ms"] for x in rows[1:]] or [rows[0]["parent_cpu_ms"]]
    print(f"tree {tree}: steady parent CPU {min(steady):.3f}-{max(steady):.3f} ms/scenario "
          f"(mean {sum(steady) / len(steady):.3f}); load average {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"tree": tree, "date": time.strftime("%Y-%m-%d %H:%M"),
                                               "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
                                               "passes": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

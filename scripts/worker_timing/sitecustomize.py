"""How busy the kernel worker is, and on what: a hook loaded by every Python process started with this
folder first on PYTHONPATH (the kernel worker included, through the forkserver).

    CPSIM_WPROF=DIR [CPSIM_WPROF_LIGHT=1] [CPSIM_WPROF_EVERY=300] PYTHONPATH=scripts/worker_timing:$PWD \
        python3 scripts/bench_fuzz.py --issue15-device cuda --examples 150 --passes 3

Every CPSIM_WPROF_EVERY chunks (``kernel_worker._run_ranks`` calls; a fuzz scenario is one per path)
the worker writes DIR/worker-{light,prof}-PID.txt: the wall time spent running chunks against the wall
time since the first of them (its busy share), and without CPSIM_WPROF_LIGHT a cProfile of those
chunks. The counters start again after each file. Used for docs/BENCHMARKS.md, fuzz sixth round.

    CPSIM_WTIME=DIR [CPSIM_WPROF_EVERY=150] PYTHONPATH=scripts/worker_timing:$PWD python3 scripts/bench_fuzz.py ...

times the worker's functions instead, by path (wall time per chunk and calls per chunk, with timers around
the calls), into DIR/worker-time-PID.txt. Used for the seventh round.
"""
import os

if os.environ.get("CPSIM_WPROF"):
    import cProfile
    import io
    import pstats
    import time

    import cpsim.run.kernel_worker as kw
    _orig = kw._run_ranks
    _prof = [cProfile.Profile()]
    _n = [0]
    _t = [0.0]
    _first = [None]
    def _run_ranks(*a, **k):
        _n[0] += 1
        t = time.perf_counter()
        if _first[0] is None:
            _first[0] = t
        light = os.environ.get("CPSIM_WPROF_LIGHT")
        if not light:
            _prof[0].enable()
        try:
            return _orig(*a, **k)
        finally:
            if not light:
                _prof[0].disable()
            _t[0] += time.perf_counter() - t
            if _n[0] % int(os.environ.get("CPSIM_WPROF_EVERY", "300")) == 0:
                s = io.StringIO()
                if not light:
                    st = pstats.Stats(_prof[0], stream=s)
                    st.sort_stats("cumulative").print_stats(45)
                    st.sort_stats("tottime").print_stats(30)
                with open(os.path.join(os.environ["CPSIM_WPROF"], f"worker-{'light' if light else 'prof'}-{os.getpid()}.txt"), "w") as f:
                    f.write(f"run_ranks calls {_n[0]}, wall inside {_t[0]:.3f} s of {time.perf_counter() - _first[0]:.3f} s since the first\n" + s.getvalue())
                _prof[0] = cProfile.Profile()
                _n[0] = 0
                _t[0] = 0.0
                _first[0] = None
    kw._run_ranks = _run_ranks

if os.environ.get("CPSIM_WTIME"):
    # Wall time per function inside the kernel worker, by path, timed around the calls (a profiler
    # inflates small calls unevenly). Every CPSIM_WPROF_EVERY chunks the worker writes
    # DIR/worker-time-PID.txt (DIR = CPSIM_WTIME): per path, ms per chunk in each function; counters restart.
    import collections
    import functools
    import sys
    import time

    import cpsim.run.kernel_worker as kw
    from cpsim import allocator
    from cpsim.paths import _guard, _inputs, replay_padding, v1, v2
    from cpsim.paths import prep as _stage

    _acc = collections.defaultdict(float)
    _chunks = collections.Counter()
    _calls = collections.Counter()
    _path = ["?"]

    def _timed(f, label):
        @functools.wraps(f)
        def inner(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                _acc[_path[0], label] += time.perf_counter() - t
                _calls[_path[0], label] += 1
        return inner

    def _patch(f, label):
        w = _timed(f, label)
        for m in list(sys.modules.values()):
            if getattr(m, "__name__", "").startswith("cpsim") and m is not None:
                for k, v in list(vars(m).items()):
                    if v is f:
                        setattr(m, k, w)

    for mod, names in ((_guard, ["table", "tables", "buffer", "blocks", "read_back"]), (allocator, ["table_entries"]),
                       (_inputs, ["upload", "upload_batch"]), (v1, ["run", "mask_padding"]),
                       (v2, ["run", "run_mrv2", "num_blocks_array"]), (replay_padding, ["pad"]), (kw, ["pack", "_run"])):
        for n in names:
            _patch(getattr(mod, n), f"{mod.__name__.split('.')[-1]}.{n}")
    for cls, names in ((_stage.Stage, ["settle", "per_rank", "table", "buffer", "shared", "batch"]),
                       (_stage.PerRank, ["table"])):
        for n in names:
            setattr(cls, n, _timed(getattr(cls, n), f"{cls.__name__}.{n}"))
    try:
        import triton.runtime.jit as _jit
    except ImportError:  # no Triton in this environment: launches are not timed
        _jit = None
    if _jit is not None:
        _jit.JITFunction.run = _timed(_jit.JITFunction.run, "triton launch")
    _orig_rr = kw._run_ranks

    def _run_ranks_timed(conn, kernels, loaded, path, *a, **k):
        _path[0] = path
        t = time.perf_counter()
        try:
            return _orig_rr(conn, kernels, loaded, path, *a, **k)
        finally:
            _acc[path, "_run_ranks (whole chunk)"] += time.perf_counter() - t
            _chunks[path] += 1
            if sum(_chunks.values()) % int(os.environ.get("CPSIM_WPROF_EVERY", "300")) == 0:
                with open(os.path.join(os.environ["CPSIM_WTIME"], f"worker-time-{os.getpid()}.txt"), "w") as f:
                    for p in sorted(_chunks):
                        f.write(f"path {p}: {_chunks[p]} chunks\n")
                        for (pp, label), v in sorted(_acc.items(), key=lambda x: -x[1]):
                            if pp == p:
                                f.write(f"  {label:32s} {v / _chunks[p] * 1e3:7.3f} ms per chunk"
                                        f" ({_calls[pp, label] / _chunks[p]:.1f} calls)\n")
                _acc.clear()
                _calls.clear()
                _chunks.clear()
    kw._run_ranks = _run_ranks_timed


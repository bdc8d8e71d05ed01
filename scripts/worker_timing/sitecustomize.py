"""How busy the kernel worker is, and on what: a hook loaded by every Python process started with this
folder first on PYTHONPATH (the kernel worker included, through the forkserver).

    CPSIM_WPROF=DIR [CPSIM_WPROF_LIGHT=1] [CPSIM_WPROF_EVERY=300] PYTHONPATH=scripts/worker_timing:$PWD \
        python3 scripts/bench_fuzz.py --issue15-device cuda --examples 150 --passes 3

Every CPSIM_WPROF_EVERY chunks (``kernel_worker._run_ranks`` calls; a fuzz scenario is one per path)
the worker writes DIR/worker-{light,prof}-PID.txt: the wall time spent running chunks against the wall
time since the first of them (its busy share), and without CPSIM_WPROF_LIGHT a cProfile of those
chunks. The counters start again after each file. Used for docs/BENCHMARKS.md, fuzz sixth round.
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

"""Several fuzz jobs (one process each, its own seed stream), their findings merged; writing the
findings as repro files and a summary."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

from cpsim import scenario as sc
from cpsim.errors import ConfigError, Interrupted
from cpsim.fuzz.repro import Repro, knobs_for_scenario, resolve_fault, size_key, write_repro
from cpsim.fuzz.searcher import SPACES, FuzzConfig, FuzzResult, Progress, search
from cpsim.fuzz.signature import Finding, merge_nested
from cpsim.fuzz.stop import JobStop
from cpsim.kernels.under_test import to_record, from_record
from cpsim.kernels import use_interpreter


# ---- several jobs --------------------------------------------------------------------

def _finding_record(f: Finding) -> dict:
    """A finding as plain data, for the queue to the parent."""
    return {**dataclasses.asdict(f), "scenario": f.scenario.to_dict(), "repro": None}


def _finding_from(x: dict) -> Finding:
    return Finding(**{**x, "scenario": sc.Scenario.from_dict(x["scenario"])})


def _job(cfg_state: dict, kernels_record: dict, queue, workers: str) -> None:
    """A job process: its own seed stream, the shared (keyed) example database. It tells the parent, over
    ``queue``, its progress, each new signature as first seen ("found", with the scenario), and at its
    end its result ("done") or its error ("failed"); so the parent holds every finding so far even if
    it has to stop this job. Ctrl-C is the parent's to handle (a terminal sends it to the whole group);
    SIGTERM, the parent's stop, ends the search with SystemExit, so this process's exit ends its own
    kernel workers; once the search has ended, SIGTERM is ignored (the process is already leaving)."""
    import signal
    import traceback
    stop = JobStop()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, stop)  # the kernel workers end before the job unwinds
    os.environ["CPSIM_KERNEL_WORKERS"] = workers
    job = cfg_state["seed_stream"]
    try:
        from cpsim.run.runner import KernelRunner

        stop.runner = runner = KernelRunner()  # the job's: kernel SPECs are imported by its workers only
        use_interpreter()
        cfg = FuzzConfig(**cfg_state, kernels=from_record(kernels_record, "cpu", inspect=runner.probe))
        last = [0.0]

        def tell(p: Progress) -> None:
            now = time.monotonic()
            if now - last[0] > 0.25:
                last[0] = now
                queue.put(("progress", job, (p.examples, p.signatures, p.phase)))

        def found(f: Finding, examples: int) -> None:
            queue.put(("found", job, (_finding_record(f), examples)))

        r = search(cfg, tell, found, runner)
        queue.put(("progress", job, (r.examples, len(r.reported), "done")))
        queue.put(("done", job, {"examples": r.examples, "shrink_runs": r.shrink_runs, "classify_runs": r.classify_runs,
                                 "not_expressible": r.not_expressible,
                                 "findings": [_finding_record(f) for f in r.findings]}))
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - a bug in cpsim itself: the parent raises it
        queue.put(("failed", job, traceback.format_exc()))
    finally:
        # The job is leaving either way. A SIGTERM now (the parent stopping every job once one failed)
        # would raise SystemExit inside the exit's own finalizers and print their traceback; the parent
        # SIGKILLs a job that does not finish leaving within its bound.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def merge(results: list[FuzzResult]) -> list[Finding]:
    """One finding per signature: the earliest sighting, the smallest scenario, shrunk if any job shrank it."""
    best: dict[str, Finding] = {}
    for r in results:
        for f in r.findings:
            b = best.get(f.signature)
            if b is None:
                best[f.signature] = dataclasses.replace(f)
                continue
            if size_key(f.scenario) < size_key(b.scenario):
                b.scenario, b.summary = f.scenario, f.summary
            if (f.first_seen, f.job) < (b.first_seen, b.job):
                b.first_seen, b.job = f.first_seen, f.job
            b.shrunk = b.shrunk or f.shrunk
            b.also = sorted(set(b.also) | set(f.also))
    return merge_nested(list(best.values()))


class JobFailed(RuntimeError):
    """A fuzz job process raised (a bug in cpsim) or died before it reported its result.

    ``job``: its index; ``cause``: one line; ``trace``: the job's own traceback ("" when it died)."""

    def __init__(self, job: int, cause: str, trace: str = ""):
        super().__init__(f"fuzz job {job} failed: {cause}")
        self.job, self.cause, self.trace = job, cause, trace


class JobEnded(RuntimeError):
    """A fuzz job process was ended by a signal cpsim did not send (the parent signals a job only after
    it stopped reporting): the kernel under test, whose workers are the job's children, or something
    outside cpsim. Not a bug in cpsim (exit 3), and never a pass: the search stopped there.

    ``why``: what the summary's ``interrupted`` says; ``partial``: every finding reported before."""

    def __init__(self, job: int, signal_name: str):
        super().__init__(f"fuzz job {job} was ended by {signal_name}, which cpsim did not send (the kernel under "
                         f"test signalled its job, or something outside cpsim did); the search stopped there")
        self.why = f"{signal_name} of fuzz job {job}, not sent by cpsim"
        self.partial: FuzzResult | None = None


def _ending_signal(exitcode: int | None) -> str | None:
    """The signal that ended a job process, by its exit code: killed by it (negative), or its SIGTERM
    handler's exit (:class:`cpsim.fuzz.stop.JobStop`, 128 + SIGTERM); None for any other exit."""
    import signal
    if exitcode is not None and exitcode < 0:
        return signal.Signals(-exitcode).name
    return "SIGTERM" if exitcode == 128 + signal.SIGTERM else None


class _Jobs:
    """The parent's side of ``search_jobs``: the job processes and what they have said so far."""

    def __init__(self, ctx, states: list[dict], record: dict, workers: str,
                 on_progress: Callable[[dict], None] | None, on_found: Callable[[Finding, int], None] | None):
        self.queue = ctx.Queue()
        self.on_progress, self.on_found = on_progress, on_found
        self.status: dict[int, tuple] = {}
        self.found: dict[int, list[Finding]] = {}
        self.done: dict[int, dict] = {}
        self.procs = {st["seed_stream"]: ctx.Process(target=_job, args=(st, record, self.queue, workers),
                                                     name=f"cpsim-fuzz-job-{st['seed_stream']}")
                      for st in states}
        for p in self.procs.values():
            p.start()

    def take(self, timeout: float) -> bool:
        """Handle one message from a job, waiting up to ``timeout``; False when none came."""
        import queue as queue_mod
        try:
            kind, job, body = self.queue.get(timeout=timeout)
        except queue_mod.Empty:
            return False
        if kind == "progress":
            self.status[job] = body
            if self.on_progress:
                self.on_progress(self.status)
        elif kind == "found":
            f = _finding_from(body[0])
            self.found.setdefault(job, []).append(f)
            if self.on_found:
                self.on_found(f, body[1])
        elif kind == "done":
            self.done[job] = body
        elif kind == "failed":
            self.stop()
            lines = [ln for ln in body.strip().splitlines() if ln.strip()]
            raise JobFailed(job, lines[-1].strip() if lines else "it raised", body)
        return True

    def wait(self) -> None:
        """Until every job has reported its result."""
        while len(self.done) < len(self.procs):
            if self.take(0.3):
                continue
            for job, p in self.procs.items():
                if job not in self.done and not p.is_alive() and not self.take(0.5):
                    self.stop()
                    if _ending_signal(p.exitcode):  # no signal of ours yet: the kernel's, or from outside
                        raise JobEnded(job, _ending_signal(p.exitcode))
                    raise JobFailed(job, f"its process ended (exit code {p.exitcode}) before it reported its result")
        for p in self.procs.values():
            p.join()

    def stop(self, bound_s: float = 10.0) -> None:
        """End every job (SIGTERM, then SIGKILL past ``bound_s``), keeping what they send meanwhile."""
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()
        end = time.monotonic() + bound_s
        while any(p.is_alive() for p in self.procs.values()) and time.monotonic() < end:
            self.take(0.05)  # a job blocked writing to a full queue needs it read
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
            p.join()
        while self.take(0):
            pass
        self.queue.close()

    def partial(self, started: float, space: str) -> FuzzResult:
        """Every finding the jobs reported so far, merged."""
        results = [FuzzResult(0, 0.0, fs, space) for fs in self.found.values()]
        return FuzzResult(sum(v[0] for v in self.status.values()), time.monotonic() - started, merge(results),
                          space, len(self.procs))


def search_jobs(cfg: FuzzConfig, on_progress: Callable[[dict], None] | None = None,
                on_found: Callable[[Finding, int], None] | None = None) -> FuzzResult:
    """``cfg.jobs`` job processes, each its own seed stream; the example budget is split. Each job sends
    every new signature to this process as first seen (``on_found(finding, examples)`` is told here), so an
    interrupt (Ctrl-C, SIGTERM) stops the jobs and re-raises with every finding so far as ``partial``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch / Triton state
    started = time.monotonic()
    share = [cfg.max_examples // cfg.jobs + (j < cfg.max_examples % cfg.jobs) for j in range(cfg.jobs)]
    states = []
    for j in range(cfg.jobs):
        st = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(FuzzConfig) if f.name != "kernels"}
        st.update(max_examples=max(share[j], 1), seed_stream=cfg.seed_stream * cfg.jobs + j, jobs=1)
        states.append(st)
    record = to_record(cfg.kernels, cfg.paths)
    from cpsim.run.isolation import usable_cores
    workers = os.environ.get("CPSIM_KERNEL_WORKERS") or str(max(1, usable_cores() // cfg.jobs))  # the cores, shared out
    jobs = None
    try:
        jobs = _Jobs(ctx, states, record, workers, on_progress, on_found)
        jobs.wait()
    except (KeyboardInterrupt, Interrupted) as e:
        if jobs is not None:
            jobs.stop()
            e.partial = jobs.partial(started, cfg.space)
        raise
    except JobEnded as e:  # wait() stopped the jobs already
        e.partial = jobs.partial(started, cfg.space)
        raise
    jobs.queue.close()
    results = [FuzzResult(d["examples"], 0.0, [_finding_from(x) for x in d["findings"]], cfg.space, 1,
                          d["classify_runs"], d["not_expressible"], d["shrink_runs"])
               for _, d in sorted(jobs.done.items())]
    return FuzzResult(sum(r.examples for r in results), time.monotonic() - started, merge(results), cfg.space,
                      cfg.jobs, sum(r.classify_runs for r in results), sum(r.not_expressible for r in results),
                      sum(r.shrink_runs for r in results))


# ---- writing the findings -------------------------------------------------------------

def check_out_dir(out: str | Path) -> Path:
    """Create ``out`` and prove it writable now, before any search (ConfigError otherwise)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".cpsim-write-test-"):
            pass
    except OSError as e:
        raise ConfigError("--out", f"cannot write to {out}: {e.strerror or e}") from None
    return out


def repro_of(cfg: FuzzConfig, f: Finding, examples: int) -> Repro:
    """The repro file's content for finding ``f`` after ``examples`` scenarios."""
    knobs = cfg.knobs if cfg.knobs is not None else resolve_fault(cfg.inject)
    return Repro(f.scenario, cfg.paths, knobs_for_scenario(knobs, f.scenario), cfg.inject, f.summary,
                 to_record(cfg.kernels, cfg.paths), profile=cfg.judged_by().name, sizing=cfg.sizing,
                 extra={"fuzz": {"seed": cfg.seed, "job": f.job, "space": cfg.space, "signature": f.signature,
                                 "first_seen": f.first_seen, "examples": examples,
                                 "allow_invalid": cfg.allow_invalid}})


def write_findings(cfg: FuzzConfig, result: FuzzResult, interrupted: str | None = None) -> list[str]:
    """One repro per reported signature, then fuzz-summary.json. Repros first; a repro that
    cannot go to ``cfg.out`` goes to a temporary directory instead. Returns one line per problem.
    ``interrupted``: the signal that stopped the search (the summary then says so)."""
    problems = []
    fallback: Path | None = None
    for f in result.reported:
        r = repro_of(cfg, f, result.drawn)
        try:
            f.repro = write_repro(cfg.out, r)
        except OSError as e:
            if fallback is None:
                fallback = Path(tempfile.mkdtemp(prefix="cpsim-repro-"))
            f.repro = write_repro(fallback, r)
            f.repro_error = f"could not write to {cfg.out} ({e.strerror or e}); written to {f.repro}"
            problems.append(f.repro_error)
    summary = {"schema": "cpsim-fuzz-summary/1", "space": cfg.describe_space(), "examples": result.drawn,
               "shrink_runs": result.shrink_runs,
               "not_expressible": result.not_expressible, "elapsed_s": round(result.elapsed_s, 3), "jobs": result.jobs, "seed": cfg.seed,
               "paths": cfg.paths, "inject": cfg.inject, **({"sizing": cfg.sizing} if cfg.sizing else {}),
               "signatures": [f.to_dict() for f in result.findings],
               **({"interrupted": interrupted} if interrupted else {})}
    try:
        (Path(cfg.out) / cfg.summary_name).write_text(json.dumps(summary, indent=2) + "\n")
    except OSError as e:
        problems.append(f"could not write {Path(cfg.out) / cfg.summary_name}: {e.strerror or e}")
    return problems


def fuzz(cfg: FuzzConfig, on_progress: Callable[[Progress], None] | None = None, runner=None) -> FuzzResult:
    """Search (one job in this process, on ``runner``: ``search``'s; or ``cfg.jobs`` workers), then write one
    repro per signature."""
    if cfg.space not in SPACES:
        raise ConfigError("--space", f"must be one of {', '.join(SPACES)}, got {cfg.space!r}")
    result = search(cfg, on_progress, runner=runner) if cfg.jobs <= 1 else search_jobs(cfg)
    write_findings(cfg, result)
    return result

"""Drive the compile check from cpsim's own venv: find the side venv, fan jobs out, collect results."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cpsim.ascend_check.registry import Job
from cpsim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SIDE_VENV = ROOT / ".venv-ascend"
FIX = "create it with `make ascend-venv` (a side venv with triton-ascend; never install it into .venv)"


@dataclass
class Result:
    job: Job
    ok: bool
    stage: str = ""
    error: str = ""
    seconds: float = 0.0


def find_python(explicit: str | None = None) -> str:
    """The side venv's interpreter: ``--ascend-python``, ``$CPSIM_ASCEND_PYTHON`` or ``.venv-ascend``."""
    where = "--ascend-python" if explicit else ("CPSIM_ASCEND_PYTHON" if os.environ.get("CPSIM_ASCEND_PYTHON")
                                                else ".venv-ascend")
    py = explicit or os.environ.get("CPSIM_ASCEND_PYTHON") or str(SIDE_VENV / "bin" / "python")
    if not Path(py).is_file():
        raise ConfigError(where, f"no triton-ascend interpreter at {py}: {FIX}")
    probe = subprocess.run([py, "-c", "from triton.backends import backends; import sys; "
                                      "sys.exit(0 if 'ascend' in backends else 3)"],
                           capture_output=True, text=True, env=_env(), timeout=300)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["its `triton` has no ascend backend"])[-1]
        raise ConfigError(where, f"{py} cannot import triton-ascend ({why}): {FIX}")
    return py


def _env() -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _call(py: str, request: dict, env: dict, on_line, timeout: float) -> tuple[int, str]:
    proc = subprocess.Popen([py, "-m", "cpsim.ascend_check.compile_worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        proc.stdin.write(json.dumps(request))
        proc.stdin.close()
        for line in proc.stdout:
            if line.strip().startswith("{"):
                on_line(json.loads(line))
        err = proc.stderr.read()
        return proc.wait(), err
    finally:
        timer.cancel()


def inspect_kernel(py: str, spec: str, path: str, abi: str, where: str, shim_vllm: bool) -> dict:
    """ABI and parameters of a user's kernel, loaded by the side venv's triton-ascend."""
    got: list[dict] = []
    rc, err = _call(py, {"mode": "inspect", "spec": spec, "path": path, "abi": abi, "where": where,
                         "shim_vllm": shim_vllm}, _env(), got.append, 300)
    if not got:
        last = (err.strip().splitlines() or [f"exit status {rc}"])[-1]
        raise ConfigError(where, f"cannot load {spec} under triton-ascend: {last}")
    if "bad_input" in got[0]:
        raise ConfigError(where, got[0]["bad_input"].split(": ", 1)[-1])
    return got[0]


def run(py: str, jobs: list[Job], arch: str, procs: int, timeout: float = 3600,
        progress=None) -> list[Result]:
    """Compile every job in ``procs`` worker processes; a worker that dies fails its current job only."""
    results: dict[int, Result] = {}
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="cpsim-ascend-") as tmp:
        env = _env()
        env["TRITON_HOME"] = tmp          # triton-ascend's caches stay in a temporary folder
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "cache")
        deadline = time.monotonic() + timeout

        def lane(indices: list[int]) -> None:
            todo = list(indices)
            while todo:
                started: list[int] = []

                def on_line(msg: dict) -> None:
                    if "start" in msg:
                        started.append(msg["start"])
                    elif "i" in msg:
                        r = Result(jobs[msg["i"]], msg["ok"], msg.get("stage", ""), msg.get("error", ""),
                                   msg.get("seconds", 0.0))
                        with lock:
                            results[msg["i"]] = r
                        if progress:
                            progress(r)
                    elif "fatal" in msg:
                        raise ConfigError("--ascend-python", msg["fatal"] + f": {FIX}")

                left = max(deadline - time.monotonic(), 1)
                rc, err = _call(py, {"mode": "compile", "arch": arch,
                                     "jobs": [(i, jobs[i].to_json()) for i in todo]}, env, on_line, left)
                todo = [i for i in todo if i not in results]
                if not todo:
                    return
                # The worker died: blame the job it had started, go on with the rest.
                bad = started[-1] if started and started[-1] in todo else todo[0]
                why = f"worker exited with status {rc}" + (" (killed: time limit)" if time.monotonic() >= deadline
                                                          else "")
                tail = [ln for ln in err.strip().splitlines() if ln.strip()]
                r = Result(jobs[bad], False, "crash", why + (f": {tail[-1].strip()}" if tail else ""))
                with lock:
                    results[bad] = r
                if progress:
                    progress(r)
                todo.remove(bad)
                if time.monotonic() >= deadline:
                    for i in todo:
                        results[i] = Result(jobs[i], False, "timeout", "not compiled: time limit reached")
                    return

        procs = max(1, min(procs, len(jobs)))
        lanes = [list(range(k, len(jobs), procs)) for k in range(procs)]
        errors: list[BaseException] = []

        def guarded(ix):
            try:
                lane(ix)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(e)

        threads = [threading.Thread(target=guarded, args=(ix,)) for ix in lanes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    return [results[i] for i in range(len(jobs))]

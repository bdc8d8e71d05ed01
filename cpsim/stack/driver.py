"""The stack driver: runs in the side venv's python, drives one release's host classes, sends arrays back.

``python -m cpsim.stack.driver FOLDER``: reads ``FOLDER/in.json`` + ``in.npz`` (one or more
jobs: a scenario each, arrays prefixed ``j{K}/``), writes ``FOLDER/out.json`` + ``out.npz``.
The release is imported and patched once for all jobs; each path of each job then runs in a
forked child of its own, bounded by a timeout, so a release that crashes (writes past a
buffer, hangs) on one job fails that job only, as a kernel-completes failure on its rank.
A job the adapter cannot express for the installed release is answered
``{"unsupported": {field, rule}}`` (one path of several: ``unsupported_paths``, the others run); a path the
release does not have is ``absent_paths`` (not in this release, n/a); exit 3 when the release itself cannot
be loaded (any exception of its import: one line, never a violation). ``installed`` names the release's
version and folder; the parent compares its contract files with cpsim's table (:mod:`cpsim.releases`).
Anything else (a crash, an exception from the release's code) is a
failure the parent reports; it never reads as success.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from cpsim.stack import FAMILIES, recording_kernel, runtime_groups
from cpsim.stack.exchange import Unsupported, read, write

JOB_TIMEOUT = 300.0  # seconds for one path of one job (every rank), in its own child


def load_classes_file(path: str):
    """The user's host classes; the file's folder goes on sys.path so that it may import its siblings."""
    sys.path.insert(0, str(Path(path).parent))
    spec = importlib.util.spec_from_file_location("cpsim_stack_classes", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def job_arrays(arrays: dict, k: int) -> dict:
    pre = f"j{k}/"
    return {name[len(pre):]: a for name, a in arrays.items() if name.startswith(pre)}


def drive_path(adapter, module, meta: dict, arrays: dict, path: str, k: int, at_rank) -> dict:
    """Every rank of one path of one job (under torchrun: this rank only, where the runtime's groups
    placed it); ``at_rank(r)`` is told each rank before it runs (crash reports)."""
    out = {}
    runtime = meta.get("runtime_groups")
    ranks = [runtime["dcp_rank"]] if runtime else range(meta["cp"]["dcp"] * meta["cp"]["pcp"])
    for rank in ranks:
        at_rank(rank)
        if meta.get("record"):  # adapter conformance: the release's kernel replaced by a recorder
            launches: list = []
            with Recording(adapter.kernel_sites(module, path), launches):
                tables, slots = adapter.drive(module, meta, arrays, path, rank)
            out[f"j{k}/{path}_r{rank}_launches"] = recording_kernel.to_bytes(launches)
        else:
            tables, slots = adapter.drive(module, meta, arrays, path, rank)
        out[f"j{k}/{path}_r{rank}_slots"] = slots
        for gi, t in enumerate(tables):
            if t is not None:
                out[f"j{k}/{path}_r{rank}_g{gi}_table"] = t
    return out


class Recording:
    """Within: each (owner, attribute) site's slot-mapping kernel is a :class:`recording_kernel.RecordingKernel`
    appending to ``launches`` (the attribute the release's host looks up at launch time)."""

    def __init__(self, sites, launches: list):
        self.sites, self.launches, self.saved = list(sites), launches, []

    def __enter__(self):
        for owner, attr in self.sites:
            kernel = getattr(owner, attr)
            self.saved.append((owner, attr, owner.__dict__[attr] if attr in vars(owner) else kernel))
            setattr(owner, attr, recording_kernel.RecordingKernel(attr, kernel.arg_names, self.launches))
        return self

    def __exit__(self, *exc):
        for owner, attr, kept in reversed(self.saved):
            setattr(owner, attr, kept)
        return False


def _where_raised(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    return f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""


def isolated(folder: Path, name: str, work, timeout: float) -> tuple[dict, dict | None]:
    """``work(at_rank)`` in a forked child (the release is imported once, in this process, before):
    (arrays, None) when it answered, else ({}, {"rank", "kind", "message"}). A crash, a hang past
    ``timeout``, an exception or an exit before answering is a failure of that job only."""
    rank_file, err_file = folder / f"{name}.rank", folder / f"{name}.err"
    pid = os.fork()
    if pid == 0:  # the child: never returns into the driver's loop
        code = 1
        try:
            arrays = work(lambda r: rank_file.write_text(str(r)))
            write(folder, name, {"answered": True}, arrays)
            code = 0
        except BaseException as e:  # the release's exception is the job's failure, reported, not raised
            err_file.write_text(f"{type(e).__name__}: {e}{_where_raised(e)}")
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        else:
            time.sleep(0.02)
    rank = int(rank_file.read_text()) if rank_file.exists() else 0
    if status is None:
        return {}, {"rank": rank, "kind": "timeout", "message": f"rank {rank}: ran past {timeout:.0f} s, killed"}
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        return {}, {"rank": rank, "kind": "crashed", "message": f"rank {rank}: the release's code died of {sig}"}
    code = os.WEXITSTATUS(status)
    if code == 0 and (folder / f"{name}.json").exists():
        return read(folder, name)[1], None
    if err_file.exists():
        return {}, {"rank": rank, "kind": "raised", "message": f"rank {rank}: {err_file.read_text()}"}
    return {}, {"rank": rank, "kind": "exited", "message": f"rank {rank}: the process exited {code} before answering"}


def run_job(adapter, module, meta: dict, arrays: dict, out: dict, k: int, folder: Path, timeout: float) -> dict:
    """One job; each of its paths in a child of its own (:func:`isolated`)."""
    meta["release_version"] = getattr(module, "version", None)  # rules that differ by release
    absent = {p: why for p in meta["paths"] if (why := adapter.absent(module, p))}
    refused = {}
    for path in [p for p in meta["paths"] if p not in absent]:
        try:
            adapter.check_supported(meta, path)
        except Unsupported as e:
            refused[path] = {"field": e.field, "rule": e.rule}
    if refused and len(refused) + len(absent) == len(meta["paths"]):
        return {"unsupported": next(iter(refused.values())), "absent_paths": absent}
    failed = {}
    for path in [p for p in meta["paths"] if p not in refused and p not in absent]:
        got, failure = isolated(folder, f"j{k}_{path}",
                                lambda at: drive_path(adapter, module, meta, arrays, path, k, at), timeout)
        out.update(got)
        if failure:
            failed[path] = failure
    answer = {"entry_sizes": adapter.entry_sizes(meta), "failed": failed, "unsupported_paths": refused,
              "absent_paths": absent}
    if hasattr(adapter, "profile"):
        answer["profile"] = adapter.profile(meta)
    # where one release's paths differ (vllm-ascend 0.18's MRV2 table holds physical ids, its v1 table
    # kernel-block ids; vLLM 0.23's v1 and MRV2 fall in different profile ranges)
    if hasattr(adapter, "path_entry_sizes"):
        answer["path_entry_sizes"] = {p: adapter.path_entry_sizes(meta, p) for p in meta["paths"]}
    if hasattr(adapter, "path_profile"):
        answer["path_profiles"] = {p: adapter.path_profile(meta, p) for p in meta["paths"]}
    return answer


def main(folder: str) -> int:
    where = Path(folder)
    top, arrays = read(where, "in")
    adapter = importlib.import_module(FAMILIES[top["family"]])
    for folder in reversed(top.get("source") or []):  # an unpacked release (sdist), not installed
        sys.path.insert(0, folder)
    try:
        classes = load_classes_file(top["classes"]) if top.get("classes") else None
        release, module = adapter.load(classes)
    except Unsupported as e:
        write(where, "out", {"unsupported": {"field": e.field, "rule": e.rule}}, {})
        return 3
    except Exception as e:  # noqa: BLE001 - a release (or classes file) that does not load: one line, never a violation
        why = f"the host classes do not load here ({type(e).__name__}: {e}{_where_raised(e)})"
        write(where, "out", {"unsupported": {"field": "--stack", "rule": why}}, {})
        return 3
    out: dict = {}
    timeout = float(top.get("job_timeout") or JOB_TIMEOUT)
    dist = top.get("dist")
    groups = None
    if dist:  # under torchrun: one job, this rank's, in the runtime's own process groups
        groups = _runtime_groups(dist, top["jobs"][0], module, where)
        if groups is None:
            return 0
        for meta in top["jobs"]:
            meta["runtime_groups"] = groups
    jobs = [run_job(adapter, module, meta, job_arrays(arrays, k), out, k, where, timeout)
            for k, meta in enumerate(top["jobs"])]
    applied = adapter.patches(runtime_groups=bool(dist))
    if groups:
        applied.append(groups["source"])
    write(where, "out", {"release": release, "patches": applied, "jobs": jobs, "runtime_groups": groups,
                         "installed": getattr(module, "installed", None)}, out)
    if dist:
        runtime_groups.close(module)
    return 0


def _runtime_groups(dist: dict, meta: dict, module, where: Path) -> dict | None:
    """This rank's place in the runtime's groups; None once it answered why there is none (a raise in
    the release's own setup: the rank's failure, reported like a crash of its host code)."""
    try:
        return runtime_groups.init(dist, meta, module)
    except Exception as e:  # noqa: BLE001 - the release's (or the classes file's) setup failed: reported
        write(where, "out", {"groups_failed": f"{type(e).__name__}: {e}{_where_raised(e)}"}, {})
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

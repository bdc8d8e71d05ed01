"""``make upstream-check``: cpsim against what released vLLM / vllm-ascend ship.

For each vLLM release (scripts/upstream_install.py, once: one shared dependency venv, ``base``, and the
release in a ``pip install --no-deps --target`` folder of its own, put first on the driver child's
sys.path): its host block-table classes through the stack driver (``cpsim.stack``; the release is imported once, every
(scenario, path) job then runs in a forked child of its own with a timeout), judged here by the
release's profile (``cpsim.check.profiles``, chosen by the installed version); then its
released kernels (``--kernel-v1`` / ``--kernel-v2`` by path into the installed release,
``--shim-vllm``) on a few presets and a short fuzz. For vllm-ascend releases: their released
MRV2 kernel from the sdist (``ascend-v2-0.18``), and their v1 and MRV2 host classes (``ASCEND_HOSTS``:
the unpacked sdist first on the child's sys.path, then the folder of the vLLM release it was built
for) on ``ASCEND_HOST_PRESETS``.

Writes the release x subject x scenario x path matrix into data/upstream/matrix.md and each failing
step as an explicit batch under data/upstream/repros/. Exit 1 when a release cannot be loaded or
judged, or a failure is not in data/upstream/known.json; known findings keep it at 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # upstream_plan

import upstream_plan as plan  # noqa: E402
from cpsim import releases  # noqa: E402
from cpsim import scenario as sc  # noqa: E402
from cpsim.presets import PRESETS, preset  # noqa: E402

# The releases come from the release table (cpsim/releases/*.json "matrix"; scripts/upstream_plan.py).
VLLM = plan.matrix("vllm", "host")
VLLM_KERNELS_ONLY = plan.matrix("vllm", "kernels_only")  # kernels run (from the wheel), host classes not driven
ASCEND_KERNELS = plan.matrix("vllm-ascend", "kernels")
# vllm-ascend host classes: (release, the vLLM release it was built for, its paths). The pairing is read
# from each sdist (vllm_version_is("X") throughout vllm_ascend/, docs/source/conf.py's ci_vllm_version)
# into the table's "built_for".
ASCEND_HOSTS = plan.ascend_hosts()
# default plus the presets that show a finding on 0.18.0 / 0.23.0.post1 (data/upstream/matrix.md).
ASCEND_HOST_PRESETS = ("default", "mtp", "hybrid-interleave", "huge-cache")
KERNEL_PRESETS = ("default", "mtp", "hybrid-mamba", "decode-heavy")
# Host classes under torchrun in the runtime's own process groups (cpsim.stack.runtime_groups): one vLLM and
# one vllm-ascend release, (release, family, the vLLM folder, the sdist or None); TORCHRUN_WORLD ranks as
# TP = the world, DCP = TORCHRUN_DCP: two DCP groups, each DCP rank held by two TP ranks.
TORCHRUN_HOSTS = plan.torchrun_hosts()
TORCHRUN_WORLD, TORCHRUN_DCP = 4, 2
FUZZ_EXAMPLES = 8
# Fuzz rows draw the same scenarios on every run (a release's row is then reproducible: CI meets what a
# local run met). Only the shrinker's random passes still vary, which known_entry tolerates.
FUZZ_SEED = 0
JOB_TIMEOUT = 300
RUN_TIMEOUT = 900
KNOWN = ROOT / "data" / "upstream" / "known.json"
DOC = ROOT / "data" / "upstream" / "matrix.md"
REPROS = ROOT / "data" / "upstream" / "repros"
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"


# ---- rows and the verdict of the check (pure; tests/test_stack.py feeds them fake rows) ----------------

def row(release: str, subject: str, scenario: str, path: str, verdict: str, fails=(), detail: str = "",
        repro: str = "") -> dict:
    """One matrix cell. verdict: pass | fail | not expressible | broken (cpsim could not load or judge it).
    ``fails``: the failing "invariant:group" names; the key a known finding is recorded under."""
    fails = sorted(fails)
    return {"release": release, "subject": subject, "scenario": scenario, "path": path, "verdict": verdict,
            "fails": fails, "detail": detail or ", ".join(fails), "repro": repro,
            "key": f"{subject}|{scenario}|{path}|{','.join(fails)}"}


def _same(name: str, recorded: str) -> bool:
    """Whether failing ``name`` is the finding ``recorded``. Host rows name ``invariant:group`` and must match
    exactly. Fuzz rows name signatures ``path:group:inv[+inv]:class``; the class and the combination of
    invariants depend on which draw the search met first, so a signature is the recorded one when path and
    group agree and each of its invariants is among the recorded signature's. A ``*`` group is one cpsim could
    not name (the kernel crashed before a launch said which): any group."""
    a, b = name.split(":"), recorded.split(":")
    if len(a) != len(b):
        return False
    if len(a) != 4:
        return a == b
    return a[0] == b[0] and a[1] in (b[1], "*") and set(a[2].split("+")) <= set(b[2].split("+"))


def _covered(name: str, recorded) -> bool:
    """A fuzz signature's invariants may be spread over several recorded signatures of the same path and group."""
    if any(_same(name, c) for c in recorded):
        return True
    a = name.split(":")
    if len(a) != 4:
        return False
    same_place = [c.split(":") for c in recorded if len(c.split(":")) == 4]
    seen = {inv for b in same_place if b[0] == a[0] and a[1] in (b[1], "*") for inv in b[2].split("+")}
    return set(a[2].split("+")) <= seen


def known_entry(known: dict, r: dict) -> dict | None:
    """The recorded finding(s) that cover row ``r``: every failing name of the row is recorded for the same
    release, subject, scenario and path (an entry's key lists the names it covers). A name no entry of
    that cell lists is new; a recorded name that no longer fails is not an error (the release or cpsim's
    oracle moved on; `--rejudge` shows it)."""
    cell = known.get(r["release"], {})
    if r["key"] in cell:
        return cell[r["key"]]
    prefix = f"{r['subject']}|{r['scenario']}|{r['path']}|"
    entries = {k: v for k, v in cell.items() if k.startswith(prefix)}
    covered = {name for k in entries for name in k[len(prefix):].split(",") if name}
    if not r["fails"] or not all(_covered(name, covered) for name in r["fails"]):
        return None
    used = [v for k, v in entries.items() if any(_covered(n, k[len(prefix):].split(",")) for n in r["fails"])]
    defect = [v.get("upstream_defect") for v in used]
    return {"reason": " | ".join(v.get("reason", "") for v in used),
            "upstream_defect": True if True in defect else (None if None in defect else False)}


def classify(rows: list[dict], known: dict) -> tuple[list[dict], list[dict]]:
    """(new findings, broken rows): a failure not recorded for its release is new; a row cpsim could
    not load or judge is broken whatever the known file says. Either fails the check."""
    new = [r for r in rows if r["verdict"] == "fail" and known_entry(known, r) is None]
    broken = [r for r in rows if r["verdict"] == "broken"]
    return new, broken


def exit_code(rows: list[dict], known: dict) -> int:
    new, broken = classify(rows, known)
    if new or broken or not rows:
        return 1
    return releases.UNREAD_CHANGES_EXIT if any(r["verdict"] == plan.UNREAD for r in rows) else 0


def markdown(rows: list[dict], known: dict) -> str:
    lines = ["| release | subject | scenario | path | verdict | failing invariant:group | repro | known as |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        note = ""
        if r["verdict"] == "fail":
            k = known_entry(known, r)
            kind = {True: "upstream defect", False: "mismatch", None: "unclassified"}[k.get("upstream_defect")] \
                if k is not None else ""
            note = "**NEW**" if k is None else f"{kind}: {k.get('reason', '')}"
        elif r["verdict"] == "broken":
            note = "**cpsim cannot load or judge it**"
        elif r["verdict"] == plan.UNREAD:
            note = "**judged with the nearest listed release's contract: unread changes**"
        repro = ""
        if r.get("repro"):
            kept = ROOT / r["repro"]
            repro = (f"[{kept.name}]({os.path.relpath(kept, DOC.parent)})"
                     if kept.is_relative_to(REPROS) else f"`{r['repro']}` (not shrunk, not kept)")
        detail = r["detail"].replace("|", "/")
        lines.append(f"| {r['release']} | {r['subject']} | {r['scenario']} | {r['path']} | {r['verdict']} | "
                     f"{detail} | {repro} | {note} |")
    return "\n".join(lines)


def write_matrix(doc: Path, table: str) -> None:
    text = doc.read_text()
    doc.write_text(text[: text.index(BEGIN) + len(BEGIN)] + "\n" + table + "\n" + text[text.index(END):])


# ---- host classes (cpsim.stack) ---------------------------------------------------------------------

def within_budget(s: sc.Scenario) -> sc.Scenario:
    """The scenario as vLLM's scheduler would hand it: max_num_batched_tokens covers every scheduled and
    padded token (drafts are counted inside that budget; vllm/v1/core/sched/scheduler.py)."""
    need = max(s.batch.num_tokens, s.batch.num_tokens_padded)
    if need <= s.limits.max_num_batched_tokens:
        return s
    lim = dataclasses.replace(s.limits, max_num_batched_tokens=need)
    return dataclasses.replace(s, limits=lim, name=f"{s.name} (budget {need})")


def host_scenarios() -> list[tuple[str, sc.Scenario]]:
    out = []
    for name in PRESETS:
        s = preset(name)
        out.append((name, s))
        fitted = within_budget(s)
        if fitted is not s:
            out.append((fitted.name, fitted))
    for dcp, inter in ((2, 1), (8, 16)):
        out.append((f"default dcp{dcp} I{inter}", preset("default", dcp=dcp, interleave=inter, seed=dcp)))
    return out


def save_repro(step, release: str, subject: str, scenario: str, path: str) -> str:
    """The failing step, shrunk (cpsim.capture.shrink: fewer tokens, groups and tail while its first
    failing invariant still fails), as an explicit batch under data/upstream/repros/."""
    from cpsim.capture.batch import save
    from cpsim.capture.shrink import shrink
    from cpsim.errors import ConfigError
    where = REPROS
    try:
        step, _ = shrink(step, max_checks=400)
    except ConfigError:  # the shrinker's check does not see it fail: the whole step, kept out of data/
        where = ROOT / "build" / "upstream"
    stem = "-".join(x.replace(" ", "_").replace("(", "").replace(")", "") for x in (release, subject, scenario, path))
    where.mkdir(parents=True, exist_ok=True)
    return str(save(step, where / f"{stem}.json").relative_to(ROOT))


def check_hosts(release: str, family: str, python: str, named=None, paths=("v1", "v2"),
                source: str | None = None, vllm_version: str = "") -> list[dict]:
    """``source``: the folders put first on the child's sys.path (os.pathsep-separated). With ``vllm_version``
    (the vLLM release beside it) the same driver child also records the release's kernel launches on
    cpsim.stack.conformance's scenarios: the ``conformance`` rows."""
    from cpsim.stack import conformance, host
    named = named if named is not None else host_scenarios()
    # A tail group (row_blocks) is built by no host cpsim has read (KpoolTailSpec, vLLM #56380): not driven.
    tails = [name for name, s in named if any(g.row_blocks for g in s.groups)]
    named = [(name, s) for name, s in named if name not in tails]
    extra = conformance.scenarios() if vllm_version else []
    try:
        label, _, jobs = host.drive_many([s for _, s in named + extra], family, list(paths), python,
                                         timeout=RUN_TIMEOUT * 2, source=source, job_timeout=JOB_TIMEOUT,
                                         record=len(extra))
    except Exception as e:  # cpsim could not load or drive the release: broken, named
        return [row(release, "host", "*", "*", "broken", detail=f"{type(e).__name__}: {e}")]
    rows = [row(label, "host", name, ",".join(paths), "not expressible",
                detail="a tail group narrower than the sequence: no host of a read release builds one") for name in tails]
    rows += [r for (name, _), job in zip(extra, jobs[len(named):])
            for r in conformance.job_rows(label, family, vllm_version, name, job, paths, row)]
    jobs = jobs[:len(named)]
    for (name, _), job in zip(named, jobs):
        if job.unsupported:
            rows.append(row(label, "host", name, ",".join(paths), "not expressible",
                            detail=f"{job.unsupported[0]}: {job.unsupported[1]}"))
            continue
        for path in paths:
            if path in job.absent_paths:
                rows.append(row(label, "host", name, path, plan.NOT_IN_RELEASE, detail=job.absent_paths[path]))
                continue
            if path in job.unsupported_paths:
                rows.append(row(label, "host", name, path, "not expressible",
                                detail=": ".join(job.unsupported_paths[path])))
                continue
            step = job.steps.get(path)
            failure = job.failures.get(path)
            _, verdicts = host.judge_steps({path: step} if step else {}, job.profile_of(path),
                                           {path: failure} if failure else {})
            fails = {f"{v.invariant}:{w.group}" for v in verdicts if v.status == "fail" for w in v.violations}
            repro = save_repro(step, label, "host", name, path) if fails and step is not None else ""
            rows.append(row(label, f"host ({job.profile_of(path)})", name, path, "fail" if fails else "pass", fails,
                            repro=repro))
    return rows


# ---- released kernels (cpsim run / fuzz with the kernel by path) -------------------------------------

def cpsim(*argv: str, timeout: float = RUN_TIMEOUT) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    try:
        p = subprocess.run([sys.executable, "-m", "cpsim", *argv], capture_output=True, text=True, env=env,
                           cwd=ROOT, stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"ran past {timeout:.0f} s"
    return p.returncode, (p.stdout + p.stderr).strip()


def sweep_rows(release: str, subject: str, path: str, kernel: str, out: Path) -> list[dict]:
    """The kernel on KERNEL_PRESETS (one sweep process; the kernel is imported only in its workers)."""
    js = out / f"{release}-{subject}-{path}.json".replace(" ", "_")
    code, text = cpsim("sweep", "--presets", ",".join(KERNEL_PRESETS), "--paths", path,
                       f"--kernel-{path}", kernel, "--shim-vllm", "--quiet", "--json", str(js))
    if code not in (0, 1) or not js.exists():
        return [row(release, subject, ",".join(KERNEL_PRESETS), path, "broken",
                    detail=f"cpsim sweep exit {code}: {text.splitlines()[-1] if text else ''}")]
    got = json.loads(js.read_text())
    rows = [row(release, subject, label, path, "not expressible", detail=why) for label, why in got["skipped"].items()]
    for cell in got["groups"]:
        fails = {f"{v['invariant']}:{w['group']}" for v in cell["verdicts"] if v["status"] == "fail"
                 for w in v["violations"]}
        rows.append(row(release, subject, cell["label"], path, "fail" if fails else "pass", fails))
    return rows


def fuzz_row(release: str, subject: str, path: str, kernel: str, out: Path) -> dict:
    where = out / f"fuzz-{release}-{path}".replace(" ", "_")
    # Seeded, so no example database either (it would replay an earlier run's failures into this one).
    # The shrinker is bounded by time, so a row's signatures can still differ a little between runs.
    code, text = cpsim("fuzz", "--paths", path, f"--kernel-{path}", kernel, "--shim-vllm", "--max-examples",
                       str(FUZZ_EXAMPLES), "--seed", str(FUZZ_SEED), "--out", str(where))
    summary = where / "fuzz-summary.json"
    if code not in (0, 1) or not summary.exists():
        return row(release, subject, f"fuzz {FUZZ_EXAMPLES}", path, "broken",
                   detail=f"cpsim fuzz exit {code}: {text.splitlines()[-1] if text else ''}")
    got = json.loads(summary.read_text())
    found = [s for s in got["signatures"] if not s["ignored"]]
    repro = ""
    if found and found[0]["repro"]:
        REPROS.mkdir(parents=True, exist_ok=True)
        dest = REPROS / f"{release}-{subject}-fuzz-{path}.json".replace(" ", "_")
        dest.write_text(Path(found[0]["repro"]).read_text())
        repro = str(dest.relative_to(ROOT))
    sigs = [s["signature"] for s in found]
    return row(release, subject, f"fuzz {FUZZ_EXAMPLES}", path, "fail" if code == 1 else "pass", sigs,
               detail=", ".join(sigs) if sigs else ("" if code == 0 else "fuzz exit 1, no signature"), repro=repro)


def check_kernels(release: str, site: Path, out: Path, project: str = "vllm") -> list[dict]:
    """The release's kernels (the table's, or the nearest listed release's for one it does not list) from
    ``site``: a path the release does not have is a "not in this release" row; a kernel file missing where
    the release should have it is one broken row."""
    rows = []
    for path, (spec, absent) in plan.kernel_plan(project, release.split(" ")[1]).items():
        if absent:
            rows.append(row(release, "kernel", "*", path, plan.NOT_IN_RELEASE, detail=absent))
            continue
        file = site / spec.split(":")[0]
        if not file.exists():
            rows.append(row(release, "kernel", "*", path, "broken", detail=f"no released kernel at {spec}"))
            continue
        k = f"{file}:{spec.split(':')[1]}"
        rows += sweep_rows(release, "kernel", path, k, out)
        rows.append(fuzz_row(release, "kernel", path, k, out))
    return rows


def vllm_kernel_files(version: str, venvs: Path) -> Path:
    """The release's kernel and contract files from its wheel (downloaded once, never installed)."""
    return plan.extract_wheel(version, venvs / "src", venvs / "src" / f"vllm-{version}", RUN_TIMEOUT)


def ascend_source(version: str, venvs: Path) -> Path:
    return plan.ascend_source(version, venvs, RUN_TIMEOUT)


# ---- main -------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--venvs", default=str(ROOT / ".venv-upstream"))
    ap.add_argument("--only", default="", help="comma-separated subjects: host,kernel,ascend,ascend-host,torchrun "
                                               "(default all)")
    ap.add_argument("--vllm", default=",".join(VLLM), help=f"vLLM releases (default {','.join(VLLM)}); one the "
                                                           "release table does not list is judged with the nearest "
                                                           "listed release's contract (a contract row says how)")
    ap.add_argument("--vllm-kernels", default=",".join(VLLM_KERNELS_ONLY),
                    help=f"vLLM releases whose kernels only run (default {','.join(VLLM_KERNELS_ONLY)})")
    ap.add_argument("--latest", action="store_true", help="add the newest release of each project on the registry "
                                                          "(pip index versions) to --vllm and to the vllm-ascend kernels")
    ap.add_argument("--ascend", default=",".join(plan.default_ascend()),
                    help="vllm-ascend releases whose kernels (ASCEND_KERNELS) and host classes (ASCEND_HOSTS) run")
    ap.add_argument("--no-doc", action="store_true", help="print the matrix, leave data/upstream/matrix.md alone (a "
                                                          "narrowed run always leaves it alone)")
    ap.add_argument("--rows", default=str(ROOT / "build" / "upstream" / "rows.json"), help="where the rows go")
    ap.add_argument("--rejudge", metavar="ROWS", help="judge the rows a run saved (build/upstream/rows.json) "
                                                      "(comma-separated files) against data/upstream/known.json again, running nothing")
    args = ap.parse_args()
    args.ascend_unlisted = []
    if args.rejudge:
        return finish([r for f in args.rejudge.split(",") for r in json.loads(Path(f).read_text())], args, time.time())
    args.full = plan.full_default(args)
    if args.latest:
        plan.add_latest(args)
    venvs = Path(args.venvs).resolve()
    only = set(filter(None, args.only.split(","))) or {"host", "kernel", "ascend", "ascend-host", "torchrun"}
    out = ROOT / "build" / "upstream"
    out.mkdir(parents=True, exist_ok=True)
    t0, rows, times = time.time(), [], []
    wanted = [v for v in args.vllm.split(",") if v] if only & {"host", "kernel"} else []
    if "ascend-host" in only:
        wanted += [p for a, p, _ in ASCEND_HOSTS if a in args.ascend.split(",") and p not in wanted]
    if "torchrun" in only:
        wanted += [v for _, _, v, _ in TORCHRUN_HOSTS if v not in wanted]
    installed = install(venvs, wanted, times)
    python = str(venvs / "base" / "bin" / "python")
    for version in [v for v in args.vllm.split(",") if v] if only & {"host", "kernel"} else []:
        t = time.time()
        folder = venvs / f"vllm-{version}"
        if version not in installed:
            rows.append(row(f"vllm {version}", "install", "*", "*", "broken", detail="upstream_install.py failed"))
            continue
        st = plan.standing("vllm", version, folder, hosts=True)
        if st is not None:
            rows.append(plan.contract_row(row, f"vllm {version}", st))
        if "host" in only:
            rows += check_hosts(f"vllm {version}", "vllm", python, source=str(folder), vllm_version=version)
        if "kernel" in only:
            rows += check_kernels(f"vllm {version}", folder, out)
        times.append(f"vllm {version}: checks {time.time() - t:.0f} s")
        print(times[-1], flush=True)
    if "kernel" in only:
        for version in filter(None, args.vllm_kernels.split(",")):
            t = time.time()
            try:
                top = vllm_kernel_files(version, venvs)
            except (subprocess.SubprocessError, OSError, ValueError, zipfile.BadZipFile) as e:
                rows.append(row(f"vllm {version}", "kernel", "*", "*", "broken", detail=str(e)))
                continue
            st = plan.standing("vllm", version, top, hosts=False)
            if st is not None:
                rows.append(plan.contract_row(row, f"vllm {version}", st))
            rows += check_kernels(f"vllm {version}", top, out)
            times.append(f"vllm {version}: kernels {time.time() - t:.0f} s")
            print(times[-1], flush=True)
    if "ascend" in only:
        for version in [v for v in args.ascend.split(",") if v in ASCEND_KERNELS or v in args.ascend_unlisted]:
            t = time.time()
            try:
                src = ascend_source(version, venvs)
            except (subprocess.SubprocessError, OSError) as e:
                rows.append(row(f"vllm-ascend {version}", "kernel", "*", "v2", "broken", detail=str(e)))
                continue
            rows += check_kernels(f"vllm-ascend {version}", src, out, "vllm-ascend")
            times.append(f"vllm-ascend {version}: kernels {time.time() - t:.0f} s")
            print(times[-1], flush=True)
    if "ascend-host" in only:
        rows += check_ascend_hosts(args, venvs, times)
    if "torchrun" in only:
        for release, family, vllm_version, ascend in TORCHRUN_HOSTS:
            t = time.time()
            rows += torchrun_rows(release, family, venvs, vllm_version, ascend, out)
            times.append(f"{release} host under torchrun: {time.time() - t:.0f} s")
            print(times[-1], flush=True)
    Path(args.rows).write_text(json.dumps(rows, indent=1) + "\n")
    print("; ".join(times), flush=True)
    return finish(rows, args, t0)


def install(venvs: Path, versions: list[str], times: list[str]) -> set[str]:
    """The shared base venv and each vLLM release's folder (scripts/upstream_install.py; stamped parts are
    left alone): the versions whose folder is ready."""
    if not versions:
        return set()
    t = time.time()
    inst = subprocess.run([sys.executable, str(ROOT / "scripts" / "upstream_install.py"), str(venvs),
                           *[f"vllm=={v}" for v in versions]])
    times.append(f"install {time.time() - t:.0f} s")
    print(times[-1], flush=True)
    if inst.returncode:
        return {v for v in versions if (venvs / f"vllm-{v}" / ".cpsim-upstream").exists()}
    return set(versions)


def check_ascend_hosts(args, venvs: Path, times: list[str]) -> list[dict]:
    """vllm-ascend's host classes of each ASCEND_HOSTS release named in --ascend, the unpacked sdist first on
    the driver child's sys.path, then the folder of the vLLM release it was built for (installed above)."""
    rows = []
    named = [(n, preset(n)) for n in ASCEND_HOST_PRESETS]
    python = str(venvs / "base" / "bin" / "python")
    for version, vllm_version, paths in ASCEND_HOSTS:
        if version not in args.ascend.split(","):
            continue
        t = time.time()
        folder = venvs / f"vllm-{vllm_version}"
        try:
            src, detail = ascend_source(version, venvs), ""
        except (subprocess.SubprocessError, OSError) as e:
            src, detail = None, str(e)
        if not (folder / ".cpsim-upstream").exists() or src is None:
            rows.append(row(f"vllm-ascend {version}", "host", "*", ",".join(paths), "broken",
                            detail="upstream_install.py failed" if src is not None else detail))
            continue
        rows += check_hosts(f"vllm-ascend {version}", "vllm-ascend", python, named, paths,
                            os.pathsep.join([str(src), str(folder)]), vllm_version)
        times.append(f"vllm-ascend {version} host (beside vllm {vllm_version}): {time.time() - t:.0f} s")
        print(times[-1], flush=True)
    return rows


def torchrun_rows(release: str, family: str, venvs: Path, vllm_version: str, ascend: str | None,
                  out: Path) -> list[dict]:
    """The release's host classes under torchrun on CPU (TORCHRUN_WORLD ranks, gloo), each rank's driver
    child in the runtime's own process groups: one row per path, the failures of every CP group."""
    folder = venvs / f"vllm-{vllm_version}"
    subject = f"host torchrun (TP {TORCHRUN_WORLD}, DCP {TORCHRUN_DCP})"
    try:
        source = [str(ascend_source(ascend, venvs))] if ascend else []
    except (subprocess.SubprocessError, OSError) as e:
        return [row(release, subject, "default", "*", "broken", detail=str(e))]
    if not (folder / ".cpsim-upstream").exists():
        return [row(release, subject, "default", "*", "broken", detail="upstream_install.py failed")]
    js = out / f"{release}-torchrun.json".replace(" ", "_")
    js.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={TORCHRUN_WORLD}",
            "-m", "cpsim", "run", "--scenario", "default", "--dcp", str(TORCHRUN_DCP), "--stack", family,
            "--stack-python", str(venvs / "base" / "bin" / "python"),
            "--stack-source", os.pathsep.join(source + [str(folder)]), "--timeout", "240", "--quiet", "--json", str(js)]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                           timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        return [row(release, subject, "default", "*", "broken", detail=f"ran past {RUN_TIMEOUT} s")]
    if p.returncode not in (0, 1, releases.UNREAD_CHANGES_EXIT) or not js.exists():
        tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-3:])
        return [row(release, subject, "default", "*", "broken", detail=f"exit {p.returncode}: {tail}")]
    got = json.loads(js.read_text())
    groups, gone = got["cp_groups"], got.get("stack", {}).get("absent_paths", {})
    rows = [row(release, subject, "default", p, plan.NOT_IN_RELEASE, detail=gone[p]) for p in gone]
    for path in [p for p in ("v1", "v2") if p not in gone]:
        fails = {f"{v['invariant']}:{w['group']}" for g in groups for v in g["verdicts"]
                 if v["path"] == path and v["status"] == "fail" for w in v["violations"]}
        rows.append(row(release, subject, "default", path, "fail" if fails else "pass", fails))
    return rows


def finish(rows: list[dict], args, t0: float) -> int:
    known = json.loads(KNOWN.read_text()) if KNOWN.exists() else {}
    table = markdown(rows, known)
    print(table)
    if not args.no_doc and getattr(args, "full", False):
        write_matrix(DOC, table)
    elif not args.no_doc:
        print(f"a narrowed run: {DOC.relative_to(ROOT)} left alone (only a run of the full default set rewrites "
              f"its matrix; this run's rows are in {args.rows})")
    new, broken = classify(rows, known)
    for r in broken:
        print(f"cannot load or judge {r['release']} {r['subject']} {r['scenario']} {r['path']}: {r['detail']}")
    for r in new:
        print(f"NEW finding: {r['release']} {r['subject']} {r['scenario']} {r['path']}: {r['detail']} "
              f"(key {r['key']!r}; {r['repro']})")
    print(f"upstream-check: {len(rows)} rows, {len(new)} new, {len(broken)} broken, {time.time() - t0:.0f} s")
    return exit_code(rows, known)


if __name__ == "__main__":
    sys.exit(main())

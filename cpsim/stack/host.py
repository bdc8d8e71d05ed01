"""The parent side of a stack run: scenario -> plain arrays -> child driver -> explicit steps -> verdicts.

The child (:mod:`cpsim.stack.driver`) runs the release's code in the side venv's python
with this tree on ``PYTHONPATH``; this process never imports it. What comes back is read
as plain arrays (no pickle) and judged with :func:`cpsim.check.explicit.check`: the tables,
their widths and the slot buffers are the ones the release's host objects allocated, so
``block-sizing`` and ``capacity`` judge the constructors' arithmetic, not cpsim's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cpsim import layout, releases
from cpsim.check.explicit_batch import ExplicitStep, RankBatch
from cpsim.check import coordinator, explicit, profiles
from cpsim.errors import ConfigError
from cpsim.paths import KernelFailure
from cpsim.run import reaper
from cpsim.scenario import Scenario
from cpsim.stack import FAMILIES, HOST_SLOT_DTYPES, recording_kernel
from cpsim.stack.exchange import read, write

ROOT = Path(__file__).resolve().parents[2]
PYTHON_ENV = "CPSIM_STACK_PYTHON"
DEFAULT_TIMEOUT = 600.0
# Invariants every runtime must hold whatever its contract (the rest, sizing and padding reach,
# are profile rules: the release profiles of docs/UPSTREAM.md say which differ).
UNIVERSAL = ("kernel-completes", "row-bounds", "exactly-one-owner", "owner-rule", "replicas-agree",
             "dense-local", "no-collision", "same-scenario")


@dataclass
class StackResult:
    release: str
    patches: list[str]
    steps: dict[str, ExplicitStep]
    verdicts: list[coordinator.Verdict] = field(default_factory=list)
    scenario: Scenario | None = None
    profile: str | None = None       # the release profile it is judged by (None: cpsim's model)
    failures: dict[str, KernelFailure] = field(default_factory=dict)  # path -> the release's code did not complete
    path_profiles: dict[str, str] = field(default_factory=dict)  # path -> its profile where paths differ
    absent_paths: dict[str, str] = field(default_factory=dict)  # path -> why it is not in this release (n/a)
    standing: releases.Standing | None = None  # the release's contract: read, or the nearest listed one's


def kv_manager_blocks(s: Scenario, gi: int) -> list[np.ndarray]:
    """Group ``gi``'s block ids per request as a release's KV manager hands them to every CP rank:
    ``cdiv(allocated_len, B x g)`` ids each (one block for a mamba or ring group, as cpsim's allocator), drawn without the null block 0."""
    g = s.groups[gi]
    if g.row_blocks:
        raise ConfigError(f"groups.{g.name}.row_blocks", "a tail group narrower than the sequence: the host classes "
                                                         "of no release cpsim has read build one (not expressible)")
    world = g.world(s.cp)
    counts = [0 if n <= 0 else (1 if g.circular or not g.slot_mapped else layout.cdiv(n, g.block_size * world))
              for n in s.batch.allocated_lens()]
    total = sum(counts)
    if total > g.num_blocks - 1:
        raise ConfigError(f"groups.{g.name}.num_blocks", f"{g.num_blocks} blocks cannot hold the {total} "
                                                         f"this batch needs (block 0 is the null block)")
    rng = np.random.default_rng([s.seed, gi, 0x57AC])
    ids = rng.choice(g.num_blocks - 1, size=total, replace=False).astype(np.int64) + 1
    return np.split(ids, np.cumsum(counts)[:-1]) if counts else []


def plain_input(s: Scenario, paths: list[str]) -> tuple[dict, dict]:
    b = s.batch
    n_pad = max(b.num_tokens_padded, b.num_tokens)
    pos = np.zeros(n_pad, dtype=np.int64)
    pos[: b.num_tokens] = b.positions()
    meta = {
        "name": s.name, "paths": paths,
        "cp": {"dcp": s.cp.dcp, "pcp": s.cp.pcp, "interleave": s.cp.interleave},
        "limits": {"max_model_len": s.limits.max_model_len, "max_num_reqs": s.limits.max_num_reqs,
                   "max_num_batched_tokens": s.limits.max_num_batched_tokens,
                   "num_speculative_tokens": s.limits.num_speculative_tokens},
        "groups": [{"name": g.name, "kind": g.kind, "block_size": g.block_size, "kernel_block_size": g.b,
                    "world": g.world(s.cp)} for g in s.groups],
        "num_tokens": b.num_tokens, "num_tokens_padded": n_pad,
        # A dummy request's tokens reach an MRV2 host through idx_mapping -1 (``rows``), not as flags.
        "has_padding_flags": bool(b.is_padding) or any(r.padded_drafts for r in b.requests),
        "dummy_tokens": any(r.num_tokens and b.is_dummy(i) for i, r in enumerate(b.requests)),
        "has_replay": bool(s.replay_mask().any()),
    }
    arrays = {"positions": pos, "query_start_loc": b.query_start_loc().astype(np.int64),
              "rows": np.asarray(b.rows_v2(), dtype=np.int64)}
    for gi in range(len(s.groups)):
        per_req = kv_manager_blocks(s, gi)
        arrays[f"counts_g{gi}"] = np.array([len(x) for x in per_req], dtype=np.int64)
        arrays[f"blocks_g{gi}"] = np.concatenate(per_req) if per_req else np.zeros(0, np.int64)
    return meta, arrays


def stack_python(given: str | None) -> str:
    py = given or os.environ.get(PYTHON_ENV) or sys.executable
    if not Path(py).exists():
        raise ConfigError("--stack-python", f"{py} does not exist (make a side venv, docs/UPSTREAM.md)")
    if not Path(py).is_file() or not os.access(py, os.X_OK):
        raise ConfigError("--stack-python", f"{py} is {'a directory' if Path(py).is_dir() else 'not executable'}; "
                                            f"give the side venv's python (its bin/python, docs/UPSTREAM.md)")
    return os.path.abspath(py)  # the child runs in a folder of its own; not resolved: a venv's python is a link


@dataclass
class Job:
    """One scenario's answer: its explicit steps, or why the release cannot express it."""

    scenario: Scenario
    steps: dict[str, ExplicitStep] = field(default_factory=dict)
    unsupported: tuple[str, str] | None = None
    verdicts: list[coordinator.Verdict] = field(default_factory=list)
    judged: Scenario | None = None
    profile: str | None = None
    failures: dict[str, KernelFailure] = field(default_factory=dict)
    path_profiles: dict[str, str] = field(default_factory=dict)
    unsupported_paths: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (field, rule)
    absent_paths: dict[str, str] = field(default_factory=dict)  # path -> why it is not in this release
    launches: dict[str, list] = field(default_factory=dict)  # "{path}_r{rank}" -> recorded launches (conformance)

    def profile_of(self, path: str) -> str | None:
        return self.path_profiles.get(path, self.profile)


def stack_source(given: str | None) -> list[str]:
    """The unpacked release folders put first on the child's sys.path, in order (an sdist's top folder;
    a ``pip install --target`` folder of a release, as scripts/upstream_install.py makes them), separated
    by ``os.pathsep``: vllm-ascend beside the vLLM release it was built for is ``SDIST:VLLM_FOLDER``."""
    if not given:
        return []
    out = []
    for folder in given.split(os.pathsep):
        if not Path(folder).is_dir():
            raise ConfigError("--stack-source", f"{folder} is not a folder (the unpacked sdist's top folder, "
                                                f"the one holding the package, or a release's --target folder)")
        out.append(str(Path(folder).resolve()))
    return out


def drive_many(scenarios: list[Scenario], family: str, paths: list[str], python: str | None = None,
               classes: str | None = None, timeout: float = DEFAULT_TIMEOUT, source: str | None = None,
               job_timeout: float | None = None, record: int = 0) -> tuple[str, list[str], list[Job]]:
    """All scenarios through one child (the release is imported once; each path of each job then runs
    in a forked child of its own, ``job_timeout`` seconds at most): (release, patches, jobs).

    A release that cannot be loaded is a ConfigError (exit 2); a dead or hung driver a RuntimeError;
    a job whose release code crashed, raised or hung carries it in ``Job.failures`` (kernel-completes)."""
    top, arrays, inputs = request(scenarios, family, paths, classes, source, job_timeout)
    for meta in top["jobs"][len(scenarios) - record:] if record else []:
        meta["record"] = True  # the last ``record`` jobs: the release's kernel recorded (cpsim.stack.conformance)
    out, got = call_driver(top, arrays, family, python, timeout)
    return out["release"], out["patches"], jobs_from(out, got, scenarios, inputs, paths, family)


def request(scenarios: list[Scenario], family: str, paths: list[str], classes: str | None, source: str | None,
            job_timeout: float | None, dist: dict | None = None) -> tuple[dict, dict, list]:
    """What the driver child is handed: (top, arrays, [(meta, arrays)] per scenario); ``dist``: this
    torchrun rank and the rendezvous of the runtime's own groups (:mod:`cpsim.stack.runtime_groups`)."""
    if family not in FAMILIES:
        raise ConfigError("--stack", f"must be one of {', '.join(FAMILIES)}, got {family!r}")
    top = {"family": family, "classes": str(Path(classes).resolve()) if classes else None, "jobs": [],
           "source": stack_source(source), "job_timeout": job_timeout, "dist": dist}
    arrays: dict = {}
    inputs = []
    for k, s in enumerate(scenarios):
        host_slot_dtype(s, family, classes)
        meta, arr = plain_input(s, paths)
        top["jobs"].append(meta)
        arrays.update({f"j{k}/{n}": a for n, a in arr.items()})
        inputs.append((meta, arr))
    return top, arrays, inputs


def host_slot_dtype(s: Scenario, family: str, classes: str | None) -> None:
    """A stack run's slot buffer is the host's own allocation: a scenario that names another dtype is not
    expressible (ConfigError, exit 2); one that names the host's is honoured as it stands."""
    want = s.limits.slot_buffer_dtype
    if want == "abi":
        return
    if classes:
        raise ConfigError("limits.slot_buffer_dtype", f"host classes of your own allocate their own slot buffer; "
                                                      f"cpsim cannot make it {want} (use \"abi\")")
    if want != HOST_SLOT_DTYPES[family]:
        raise ConfigError("limits.slot_buffer_dtype", f"the {family} releases' hosts allocate "
                                                      f"{HOST_SLOT_DTYPES[family]} slot buffers, not {want} "
                                                      f"(not expressible; use \"abi\" or "
                                                      f"\"{HOST_SLOT_DTYPES[family]}\")")


def call_driver(top: dict, arrays: dict, family: str, python: str | None, timeout: float) -> tuple[dict, dict]:
    """Run the driver child once: (its answer, its arrays). ConfigError when the release cannot be
    loaded or its runtime groups cannot be set up on this rank's machine (exit 2); RuntimeError when
    the child died, hung or could not answer."""
    py = stack_python(python)
    with tempfile.TemporaryDirectory(prefix="cpsim-stack-") as tmp:
        where = Path(tmp)
        write(where, "in", top, arrays)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                     "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE"):
            env.pop(name, None)  # torchrun's rendezvous is cpsim's; the runtime's groups get one of their own
        code, stdout, stderr = _bounded([py, "-m", "cpsim.stack.driver", str(where)], env, tmp, timeout, family)
        out_json = where / "out.json"
        if code == 3 and out_json.exists():
            u = read(where, "out")[0]["unsupported"]
            raise ConfigError(u["field"], u["rule"])
        if code != 0 or not out_json.exists():
            tail = (stderr or stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"the stack driver ({family}) exited {code}: " + " | ".join(tail))
        out, got = read(where, "out")
    if "groups_failed" in out:
        raise RuntimeError(f"the runtime's process groups could not be set up: {out['groups_failed']}")
    return out, got


def _bounded(argv: list[str], env: dict, cwd: str, timeout: float, family: str) -> tuple[int, str, str]:
    """Run the driver child, ``timeout`` seconds at most. Past it, or on any interruption (Ctrl-C,
    torchrun's SIGTERM), the child's whole tree is ended (cpsim.run.reaper): its forked job and
    whatever the release's code started would otherwise outlive it."""
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except OSError as e:  # not a program the system can start (no #! line, a foreign binary)
        raise ConfigError("--stack-python", f"{argv[0]} cannot be run ({e.strerror or e}); give the side venv's "
                                            f"python (docs/UPSTREAM.md)") from None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException as e:
        reaper.end_trees([proc.pid])
        proc.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise RuntimeError(f"the stack driver ({family}) ran past {timeout:.0f} s and was killed") from None
        raise
    return proc.returncode, stdout, stderr


def standing(out: dict, family: str) -> releases.Standing | None:
    """The release the child loaded, judged here from its files (the child's word is only its version and
    folder; the hashes are read in this process): listed, or the nearest listed release's contract with
    the same or changed files. None for host classes of your own."""
    installed = out.get("installed")
    if not isinstance(installed, dict) or not isinstance(installed.get("version"), str):
        return None
    root = installed.get("root")
    return releases.standing(family, installed["version"], Path(root) if isinstance(root, str) else None,
                             need_rules=True)


def jobs_from(out: dict, got: dict, scenarios: list[Scenario], inputs: list, paths: list[str],
              family: str) -> list[Job]:
    """The driver's answer as one Job per scenario (explicit steps, failures, what was refused, what the
    release does not have)."""
    if len(out.get("jobs", [])) != len(scenarios):
        raise RuntimeError(f"the stack driver ({family}) answered {len(out.get('jobs', []))} of {len(scenarios)} jobs")
    jobs = []
    for k, (s, (meta, arr), answer) in enumerate(zip(scenarios, inputs, out["jobs"])):
        gone = {p: str(why) for p, why in answer.get("absent_paths", {}).items() if p in paths}
        if "unsupported" in answer:
            jobs.append(Job(s, unsupported=(answer["unsupported"]["field"], answer["unsupported"]["rule"]),
                            absent_paths=gone))
            continue
        mine = {n[len(f"j{k}/"):]: a for n, a in got.items() if n.startswith(f"j{k}/")}
        # virtual world: the ranks after the failed one were not run; under torchrun ("ranks": every
        # failed rank, merged by merge_ranks) each rank ran at once
        failed = {p: KernelFailure(p, f["rank"], f["kind"], f"{family} host classes, {p}, {f['message']}",
                                   not_run=[] if "ranks" in f else list(range(f["rank"] + 1, s.cp.world)))
                  for p, f in answer.get("failed", {}).items()}
        sizes = answer.get("path_entry_sizes", {})
        refused = {p: (u["field"], u["rule"]) for p, u in answer.get("unsupported_paths", {}).items()}
        steps = {p: _step(s, meta, arr, mine, sizes.get(p, answer["entry_sizes"]), p, family)
                 for p in paths if p not in failed and p not in refused and p not in gone}
        launches = {n[: -len("_launches")]: recording_kernel.from_bytes(a) for n, a in mine.items() if n.endswith("_launches")}
        jobs.append(Job(s, steps, profile=answer.get("profile"), failures=failed,
                        path_profiles=answer.get("path_profiles", {}), unsupported_paths=refused,
                        absent_paths=gone, launches=launches))
    return jobs


def drive(s: Scenario, family: str, paths: list[str], python: str | None = None, classes: str | None = None,
          timeout: float = DEFAULT_TIMEOUT, source: str | None = None, profile: str | None = None) -> StackResult:
    """One scenario driven and judged (``profile``: ``--profile``, else the release's own); a scenario the
    release cannot express is a ConfigError (exit 2), a driver that gave no answer a RuntimeError."""
    top, arrays, inputs = request([s], family, paths, classes, source, None)
    out, got = call_driver(top, arrays, family, python, timeout)
    return _judge_answer(out, got, s, inputs, paths, family, profile)


def _judge_answer(out: dict, got: dict, s: Scenario, inputs: list, paths: list[str], family: str,
                  profile: str | None) -> StackResult:
    """One scenario's driver answer judged, on every path asked for that the release has
    (:func:`refuse_unjudged`), then the release's contract read (:func:`standing`)."""
    (job,) = jobs_from(out, got, [s], inputs, paths, family)
    refuse_unjudged(job, paths, out["release"])
    result = judge(StackResult(out["release"], out["patches"], job.steps, scenario=s, profile=job.profile,
                               failures=job.failures, path_profiles=job.path_profiles,
                               absent_paths=job.absent_paths), profile)
    result.standing = standing(out, family)
    return result


def no_answer(s: Scenario, paths: list[str], why: str) -> StackResult:
    """A driver that gave no answer (died, hung, printed anything but an answer), or a CP group none of whose
    torchrun ranks did: every path fails ``kernel-completes`` with ``why`` on rank 0 (the others not run),
    judged like an answer so that every requested report is written."""
    return judge(StackResult("(no answer)", [], {}, scenario=s, failures={
        p: KernelFailure(p, 0, "exited", why, not_run=list(range(1, s.cp.world))) for p in paths}))


def refuse_unjudged(job: Job, paths: list[str], release: str) -> None:
    """A run judges every path it was asked for that the release has, or none (ConfigError, exit 2); a path
    the release does not have is n/a, and asking only for such paths is exit 2 naming them."""
    if job.unsupported:
        raise ConfigError(*job.unsupported)
    if job.unsupported_paths:
        raise ConfigError(*next(iter(job.unsupported_paths.values())))
    if job.absent_paths and len(job.absent_paths) == len(paths):
        raise ConfigError("--paths", f"{', '.join(job.absent_paths)} not in {release}: "
                                     f"{'; '.join(job.absent_paths.values())}")


def _step(s: Scenario, meta: dict, arrays: dict, got: dict, entry_sizes: list[int], path: str,
          family: str) -> ExplicitStep:
    ranks = []
    num_reqs = len(arrays["query_start_loc"]) - 1
    rows = arrays["rows"] if path == "v2" else np.arange(num_reqs, dtype=np.int64)
    for r in range(s.cp.world):
        tables = [got.get(f"{path}_r{r}_g{gi}_table") for gi in range(len(s.groups))]
        ranks.append(RankBatch(arrays["positions"], arrays["query_start_loc"], rows, meta["num_tokens_padded"],
                               [None if t is None else t.astype(np.int64) for t in tables],
                               got[f"{path}_r{r}_slots"]))
    return (ExplicitStep(path, s.cp, s.groups, tuple(entry_sizes), s.limits, ranks,
                                 {"name": f"{s.name}@{family}"}))


def judge_steps(steps: dict[str, ExplicitStep], profile: str | None = None,
                failures: dict[str, KernelFailure] | None = None, path_profiles: dict[str, str] | None = None
                ) -> tuple[Scenario | None, list[coordinator.Verdict]]:
    """Every invariant on every path's step (the coordinator's checks, unchanged), by the release's
    profile when the adapter names one (``path_profiles`` where a path's differs; else cpsim's model);
    a path whose release code did not complete is kernel-completes failed on its rank, the rest of
    that path not run."""
    judged, out = None, []
    for path, step in steps.items():
        name = (path_profiles or {}).get(path, profile)
        judged, _, verdicts = explicit.check(step, profile=profiles.get(name) if name else None)
        out += verdicts
    for path, failure in (failures or {}).items():
        world = judged.cp.world if judged is not None else failure.rank + 1 + len(failure.not_run)
        out += coordinator.kernel_failed(path, failure, world)
    return judged, out


def judge(result: StackResult, profile: str | None = None) -> StackResult:
    """``profile``: an override (``--profile``); default the one the adapter named for the release."""
    result.profile = profile or result.profile
    per_path = {} if profile else result.path_profiles
    judged, result.verdicts = judge_steps(result.steps, result.profile, result.failures, per_path)
    result.scenario = judged or result.scenario
    return result


def universal_failures(verdicts) -> list[coordinator.Verdict]:
    return [v for v in verdicts if v.status == "fail" and v.invariant in UNIVERSAL]


# ---- under torchrun: one rank each, in the runtime's own groups ---------------------------------------

def drive_rank(s: Scenario, family: str, paths: list[str], dist: dict, python: str | None = None,
               classes: str | None = None, source: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """This torchrun rank's run of the release: its driver child sets up the runtime's own groups
    (``dist``: rank, world, init_method, timeout_s) and drives the host objects of the DCP rank they
    give it. Plain data for the all-gather: {"answer", "arrays"}, {"refused": (field, rule)} or
    {"error": text} (the child died, hung, or the groups could not be set up)."""
    # The host code's bound is half the groups' (and the gathers') --timeout: a rank whose host code hangs
    # answers its timeout while the peers still wait at the gather, a violation on that rank, not a stop.
    try:
        top, arrays, _ = request([s], family, paths, classes, source, dist["timeout_s"] / 2, dist)
        out, got = call_driver(top, arrays, family, python, timeout)
    except ConfigError as e:
        return {"refused": (e.field, e.rule)}
    except RuntimeError as e:
        return {"error": str(e)}
    answer = out["jobs"][0] if out.get("jobs") else {}
    if "unsupported" in answer:
        return {"refused": (answer["unsupported"]["field"], answer["unsupported"]["rule"])}
    return {"answer": out, "arrays": got}


def merge_ranks(s: Scenario, ranks: list[dict], paths: list[str], first: int = 0) -> tuple[dict, dict]:
    """One CP group's :func:`drive_rank` answers (torchrun ranks ``first`` on, in order) as one driver
    answer over the CP world, for :func:`jobs_from`. A path fails on every rank whose release code did
    not complete there (the lowest named first, the others in its message); a rank whose driver died
    fails every path. Each rank's arrays sit at the DCP rank the runtime's groups gave it; a DCP size
    other than the scenario's, a rank outside it or two ranks at one DCP rank is a RuntimeError (the
    runtime's layout is not the scenario's)."""
    ok = [(i, x["answer"]) for i, x in enumerate(ranks) if "answer" in x]
    if not ok:
        raise RuntimeError("no rank's driver answered: " + "; ".join(f"rank {first + i}: {x['error']}"
                                                                     for i, x in enumerate(ranks)))
    placed: dict[int, int] = {}
    for i, out in ok:
        g = out["runtime_groups"]
        if g["dcp_world"] != s.cp.dcp or not 0 <= g["dcp_rank"] < s.cp.dcp:
            raise RuntimeError(f"the runtime put torchrun rank {first + i} at DCP rank {g['dcp_rank']} of "
                               f"{g['dcp_world']}; the scenario has DCP {s.cp.dcp}")
        if g["dcp_rank"] in placed:
            raise RuntimeError(f"the runtime put torchrun ranks {first + placed[g['dcp_rank']]} and {first + i} "
                               f"both at DCP rank {g['dcp_rank']}")
        placed[g["dcp_rank"]] = i
    head = ok[0][1]
    answer = dict(head["jobs"][0])
    failures: dict[str, list[dict]] = {}
    for i, x in enumerate(ranks):
        if "answer" in x:
            for p, f in x["answer"]["jobs"][0].get("failed", {}).items():
                said = f"rank {f['rank']}: "  # the child names the DCP rank it drove
                text = f["message"][len(said):] if f["message"].startswith(said) else f["message"]
                failures.setdefault(p, []).append({**f, "rank": i, "message": f"torchrun rank {first + i} "
                                                   f"(DCP rank {f['rank']}): {text}"})
        else:
            for p in [p for p in paths if p not in head["jobs"][0].get("unsupported_paths", {})]:
                failures.setdefault(p, []).append({"rank": i, "kind": "exited",
                                                   "message": f"torchrun rank {first + i}: {x['error']}"})
    answer["failed"] = {p: _merged_failure(fs, first) for p, fs in failures.items()}
    got: dict = {}
    for x in ranks:
        got.update(x.get("arrays", {}))
    merged = {"release": head["release"], "patches": head["patches"], "jobs": [answer],
              "runtime_groups": {i: out["runtime_groups"] for i, out in ok}, "installed": head.get("installed")}
    return merged, got


def _merged_failure(fs: list[dict], first: int) -> dict:
    fs = sorted(fs, key=lambda f: f["rank"])
    also = ", ".join(f"torchrun rank {first + f['rank']} ({f['kind']})" for f in fs[1:])
    return {**fs[0], "message": fs[0]["message"] + (f"; also failed on {also}" if also else ""),
            "ranks": [f["rank"] for f in fs]}


def judge_ranks(s: Scenario, family: str, paths: list[str], classes: str | None, source: str | None,
                profile: str | None, ranks: list[dict]) -> list[tuple[StackResult, dict]]:
    """Rank 0: the ranks' :func:`drive_rank` answers judged, one CP group of ``s.cp.world`` consecutive
    ranks at a time, as the virtual world's one scenario is: (StackResult, where each rank sat in the
    runtime's groups) per group. A rank that refused the scenario is a ConfigError (exit 2)."""
    refused = [x["refused"] for x in ranks if "refused" in x]
    if refused:
        raise ConfigError(*refused[0])
    _, _, inputs = request([s], family, paths, classes, source, None)
    n = s.cp.world
    return [_judge_group(s, family, paths, profile, inputs, ranks[first: first + n], first)
            for first in range(0, len(ranks), n)]


def _judge_group(s: Scenario, family: str, paths: list[str], profile: str | None, inputs: list, ranks: list[dict],
                 first: int) -> tuple[StackResult, dict]:
    """One CP group (torchrun ranks ``first`` on): (StackResult, what the runtime's groups said)."""
    world = first + len(ranks)
    try:
        out, got = merge_ranks(s, ranks, paths, first)
    except RuntimeError as e:  # no rank answered, or the runtime's layout is not the scenario's
        return (no_answer(s, paths, f"torchrun ranks {first}-{world - 1}: {e}"),
                {"ranks": [{"rank": r, "error": str(e)} for r in range(first, world)]})
    result = _judge_answer(out, got, s, inputs, paths, family, profile)
    failed_on = {p: [first + r for r in f["ranks"]] for p, f in out["jobs"][0].get("failed", {}).items()}
    for v in result.verdicts:  # every rank ran at once: the violation names each rank whose host code failed
        if v.invariant == "kernel-completes" and v.path in failed_on:
            for x in v.violations:
                x.ranks, x.count = failed_on[v.path], len(failed_on[v.path])
    placed = out["runtime_groups"]
    return result, {"ranks": [
        {"rank": first + r, **({"dcp_rank": placed[r]["dcp_rank"], "dcp_world": placed[r]["dcp_world"]} if r in placed
                               else {"error": ranks[r].get("error", "no answer")})} for r in range(len(ranks))]}

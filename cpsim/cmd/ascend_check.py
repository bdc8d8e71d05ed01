"""`cpsim ascend-check`: compile kernels for an Ascend NPU offline, up to `triton-adapter-opt`.

Without --kernel-* options: every built-in kernel cpsim launches on an NPU, for every
constexpr combination it launches (cpsim/ascend_check/registry.py). With them: the
user's kernels, with the constexprs cpsim's adapters pass for their ABI.
The compiler is triton-ascend in a side venv (`make ascend-venv`); the final stage
(`bishengir-compile`, CANN) is not run. Exit 0 all compile, 1 one fails, 2 bad input
or no triton-ascend.
"""

from __future__ import annotations

import json
import time

from cpsim.report import terminal
from rich.table import Table

from cpsim.errors import ConfigError
from cpsim.ascend_check import registry, fan_out

PATH_FLAGS = {"v1": "kernel_v1", "v1-fused": "kernel_v1_fused", "v2": "kernel_v2", "replay": "kernel_replay"}


def _jobs(args, py: str):
    jobs = []
    user = {path: getattr(args, attr) for path, attr in PATH_FLAGS.items() if getattr(args, attr)}
    if not user or args.builtin:
        names = [e.name for e in registry.BUILTINS]
        for n in args.only or []:
            if n not in names:
                raise ConfigError("--only", f"unknown built-in kernel {n!r}; choose from {', '.join(names)}")
        jobs += registry.builtin_jobs(args.only)
    for path, spec in user.items():
        where = f"--kernel-{path}"
        info = fan_out.inspect_kernel(py, spec, path, args.kernel_abi, where, args.shim_vllm)
        params = info["params"]
        types = dict(registry.USER_ARG_TYPES, **registry.USER_ARG_TYPES_BY_ABI.get(info["abi"], {}))
        sig = {}
        for p in params:
            if p["constexpr"]:
                continue
            if p["name"] not in types:
                if p["has_default"]:
                    continue
                raise ConfigError(where, f"no argument type known for parameter {p['name']!r} of {spec}")
            sig[p["name"]] = types[p["name"]]
        constexprs = {p["name"] for p in params if p["constexpr"]}
        for c in registry.user_combos(info["abi"], constexprs):
            jobs.append(registry.Job(f"{spec} ({info['abi']})", spec, sig, c, args.shim_vllm))
    return jobs


def main(args) -> int:
    if args.jobs < 1:
        raise ConfigError("--jobs", f"must be >= 1, got {args.jobs}")
    out = terminal.console()
    py = fan_out.find_python(args.ascend_python)
    jobs = _jobs(args, py)
    if not jobs:
        raise ConfigError("ascend-check", "nothing to compile")
    t0 = time.perf_counter()
    done = [0]

    def progress(r):
        done[0] += 1
        if not r.ok:
            out.print(f"[red]FAIL[/red] {r.job.kernel} [{r.job.label()}]: {r.stage}: {r.error}", highlight=False,
                      soft_wrap=True)
        elif done[0] % 25 == 0:
            out.print(f"  {done[0]}/{len(jobs)} compiled", highlight=False)

    out.print(f"compiling {len(jobs)} kernel x constexpr combination(s) for GPUTarget('npu', '{args.arch}', 0) "
              f"up to triton-adapter-opt, {min(args.jobs, len(jobs))} process(es)", highlight=False)
    results = fan_out.run(py, jobs, args.arch, args.jobs, args.timeout, progress)
    wall = time.perf_counter() - t0
    table = Table(title="Ascend compile check (frontend + triton-adapter-opt; bishengir-compile not run)")
    for col in ("kernel", "combinations", "pass", "fail", "first failure"):
        table.add_column(col)
    by_kernel: dict[str, list] = {}
    for r in results:
        by_kernel.setdefault(r.job.kernel, []).append(r)
    for name, rs in by_kernel.items():
        bad = [r for r in rs if not r.ok]
        first = f"{bad[0].stage}: {bad[0].error}" if bad else ""
        table.add_row(name, str(len(rs)), str(len(rs) - len(bad)), str(len(bad)), first)
    out.print(table)
    failed = [r for r in results if not r.ok]
    out.print(f"{len(results) - len(failed)} passed, {len(failed)} failed in {wall:.1f} s "
              f"({len(results)} compilations up to triton-adapter-opt)", highlight=False)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"arch": args.arch, "wall_seconds": round(wall, 2), "results": [
                {"kernel": r.job.kernel, "target": r.job.target, "constants": r.job.constants, "ok": r.ok,
                 "stage": r.stage, "error": r.error, "seconds": r.seconds} for r in results]}, f, indent=1)
    return 1 if failed else 0

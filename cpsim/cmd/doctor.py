"""`cpsim doctor`: what to run first on a new server.

Checks Python, torch, torch_npu / CUDA, triton or triton-ascend, the devices and
environment variables, the backend torchrun would use, and runs every built-in
kernel once on the device against the coordinator. Under `torchrun`
(`launch/local.sh N doctor`) every rank checks its own device, one bounded
all-gather crosses all ranks, and rank 0 prints every rank's rows.
Exit 0 when nothing is off, 1 with the fix named when something is.

Test hook (as for `cpsim run`, see cpsim/run/distrun.py): `CPSIM_TEST_FAULT_RANK=r`
checks rank r's kernels compiled with `CPSIM_TEST_FAULT` fault bits.
"""

from __future__ import annotations

import os
import socket
import time

from rich.console import Console

from cpsim.report import terminal
from rich.markup import escape
from rich.table import Table

from cpsim import environment_checks
from cpsim.cmd.inputs import kernel_runner
from cpsim.run.dist import launched_by_torchrun

STYLE = {"ok": "green", "info": "dim", "warn": "yellow", "fail": "bold red"}


def main(args) -> int:
    if launched_by_torchrun():
        return main_torchrun(args)
    rows, dev = environment_checks.collect(args.device, kernels=not args.skip_kernels, runner=kernel_runner(args))
    rows.append(environment_checks.Row("torchrun", "info", "not under torchrun: `launch/local.sh N doctor` also checks "
                                                "one all-gather across N ranks"))
    ranks = [{"rank": 0, "host": socket.gethostname(), "device": dev.describe() if dev else "none"}]
    return report(terminal.console(), [rows], ranks, args.json)


def report(console: Console, per_rank: list[list[environment_checks.Row]], ranks: list[dict], json_path: str | None) -> int:
    """Print the table (one column per rank set under torchrun) and the verdict; write --json."""
    world = len(per_rank)
    merged = environment_checks.merge(per_rank)
    if world > 1:
        rt = Table(title=f"{world} rank(s)", title_justify="left")
        for col in ("rank", "host", "pid", "device"):
            rt.add_column(col, justify="right" if col in ("rank", "pid") else "left")
        for r in ranks:
            rt.add_row(str(r["rank"]), r["host"], str(r.get("pid", "")), r["device"])
        console.print(rt)
    t = Table(title=f"cpsim doctor · {world} rank(s)" if world > 1 else "cpsim doctor", title_justify="left")
    t.add_column("check", no_wrap=True)
    if world > 1:
        t.add_column("ranks", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("detail")
    fixes = any(m.row.fix for m in merged)
    if fixes:
        t.add_column("fix")
    for m in merged:
        r = m.row
        cells = [r.check] + ([environment_checks.rank_list(m.ranks, world)] if world > 1 else [])
        t.add_row(*cells, f"[{STYLE[r.status]}]{r.status}[/]", escape(r.detail),
                  *([escape(r.fix)] if fixes else []))
    console.print(t, soft_wrap=False)
    bad = [m for m in merged if m.row.status == "fail"]
    if bad:
        console.print(f"[bold red]{len(bad)} problem(s)[/bold red]; fix first: {bad[0].row.check}: "
                      f"{escape(bad[0].row.detail)}: {escape(bad[0].row.fix)}",
                      highlight=False, soft_wrap=True)
    else:
        console.print("[bold green]all checks ok[/bold green]")
    if json_path:
        from cpsim.report import report as rep
        rep.write_json(json_path, {
            "passed": not bad, "world_size": world, "ranks": ranks,
            "rows": [{"check": m.row.check, "status": m.row.status, "detail": m.row.detail, "fix": m.row.fix,
                      "ranks": m.ranks, "seconds": m.row.seconds} for m in merged]})
    return 1 if bad else 0


def main_torchrun(args) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record
    return record(_torchrun)(args)


def _torchrun(args) -> int:
    """Every rank: its own checks; one bounded all-gather; rank 0 prints everyone's rows."""
    import torch

    from cpsim.run.comm import Comm
    from cpsim.run.dist import Env, select_device
    from cpsim.run.distrun import Hooks

    env = Env.from_environ()
    hooks = Hooks.from_environ()
    # The device as `cpsim run` picks it under torchrun; a bad --device is exit 2 on every rank, as for run.
    dev = select_device(args.device, env.local_rank, env.local_world, args.oversubscribe)
    comm = Comm.init(env, dev, args.timeout, on_leave=kernel_runner(args).end)
    try:
        comm.state("doctor: all-gather")
        start = time.perf_counter()
        got = comm.all_gather(torch.tensor([comm.rank + 1], dtype=torch.int64), what="doctor all-gather")
        ms = (time.perf_counter() - start) * 1e3
        want = list(range(1, comm.world + 1))
        if got.tolist() == want:
            gather = environment_checks.Row("all-gather", "ok", f"{comm.world} ranks over {dev.backend} "
                                                    f"(bounded by --timeout {args.timeout:g} s)", seconds=ms / 1e3)
        else:
            gather = environment_checks.Row("all-gather", "fail", f"{dev.backend} all-gather returned {got.tolist()[:16]}, "
                                                      f"expected {want[:16]}",
                                "the collective library is broken: check HCCL / NCCL logs and the interconnect")
        comm.state("doctor: checks")
        rows, _ = environment_checks.collect(args.device, env.local_rank, env.local_world, args.oversubscribe,
                                 kernels=not args.skip_kernels,
                                 fault=hooks.fault if hooks.fault_rank == comm.rank else 0, runner=kernel_runner(args))
        rows.append(gather)
        mine = {"rank": comm.rank, "host": socket.gethostname(), "pid": os.getpid(), "device": dev.describe()}
        everyone = comm.all_gather_objects((mine, rows), "doctor rows", (environment_checks.Row,))
        code = 0
        if comm.rank == 0:
            code = report(terminal.console(), [r for _, r in everyone], [m for m, _ in everyone], args.json)
    except BaseException as e:  # noqa: BLE001  (Comm.fail tells the peers and ends the process)
        comm.fail(e)
    comm.finish(code)  # every rank leaves with the agreed code once rank 0 has written its report

"""``cpsim run --stack FAMILY``: judge the installed runtime's own host block-table classes.

The release's code runs in a child of ``--stack-python`` (or $CPSIM_STACK_PYTHON), a side
venv with the release installed (docs/UPSTREAM.md); this process judges what it sends back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console

from cpsim import releases
from cpsim.check import coordinator
from cpsim.cmd.options import DefaultPaths
from cpsim.cmd.inputs import kernel_runner, parse_paths, scenario_from_args, torchrun_world
from cpsim.errors import ConfigError
from cpsim.report import report
from cpsim.report.html import write_html_many
from cpsim.report.junit import write_junit
from cpsim.report.outputs import ReportFiles
from cpsim.run.torchrun_env import launched_by_torchrun
from cpsim.scenario import Scenario
from cpsim.validate import write_outputs
from cpsim.cmd.torchrun_job import rank0_writer

# v1: the release's per-group BlockTable (MultiGroupBlockTable); v2: its MRV2 BlockTables.
STACK_PATHS = ("v1", "v2")
NO_PICTURE = "no picture: the release's host classes are judged on the slot mappings they computed, not drawn"


@dataclasses.dataclass(frozen=True)
class StackRun:
    """What ``cpsim run --stack`` drives and reports, read once from its options: the scenario, the host
    paths, the release (family, side venv python, own classes, source folder), the bounds and the reports."""
    scenario: Scenario
    paths: list[str]
    family: str
    python: str | None
    classes: str | None
    source: str | None
    timeout: float
    profile: str | None
    report: ReportFiles
    device: str = "cpu"
    oversubscribe: bool = False
    runner: Any = None

    @classmethod
    def from_args(cls, args) -> "StackRun":
        s = scenario_from_args(args)
        files = ReportFiles.from_args(args)
        paths = list(STACK_PATHS) if isinstance(args.paths, DefaultPaths) else parse_paths(args.paths)
        bad = [p for p in paths if p not in STACK_PATHS]
        if bad:
            raise ConfigError("--paths", f"with --stack the paths are the runtime's host classes: "
                                         f"{', '.join(STACK_PATHS)} (got {', '.join(bad)})")
        return cls(s, paths, args.stack, args.stack_python, args.stack_classes, args.stack_source, args.timeout,
                   getattr(args, "profile", None), files, args.device, bool(getattr(args, "oversubscribe", False)),
                   kernel_runner(args))


def main(args) -> int:
    """``cpsim run --stack FAMILY`` (the option picks this command, ``cmd.options``): the virtual world, or one
    CP rank per torchrun rank (:func:`main_torchrun`)."""
    if launched_by_torchrun():
        return main_torchrun(args)
    from cpsim.stack import host
    run = StackRun.from_args(args)
    s = run.scenario
    try:  # the driver's start, the release's import and every answer: within --timeout together
        result = host.drive(s, run.family, run.paths, run.python, run.classes, run.timeout, run.source, run.profile)
    except RuntimeError as e:  # the release's code died, hung or answered nothing: never a pass
        Console().print(f"[bold red]FAIL[/bold red] {e}", highlight=False, soft_wrap=True)
        result = host.no_answer(s, run.paths, str(e))
    return _report(run, result)


def _report(run: StackRun, result, torchrun: dict | None = None, write_reports: bool = True) -> int:
    """The verdicts, the release, its profile and patches (under torchrun also where each rank sat in
    the runtime's groups); the --json / --junit / --html files, on every ending that has verdicts. The exit
    code: 1 on a violation; else UNREAD_CHANGES_EXIT when the release was judged with the nearest listed
    release's contract and its contract files changed (docs/RUNNING.md); else 0."""
    console = Console()
    verdicts, held = result.verdicts, result.standing
    stack = {"release": result.release, "profile": result.profile or "cpsim", "patches": result.patches,
             **contract_json(result), **({"torchrun": torchrun} if torchrun else {})}
    if not run.report.quiet:
        ranks = [r["rank"] for r in torchrun["ranks"]] if torchrun else []
        where = (f"torchrun ranks {ranks[0]}-{ranks[-1]}, the runtime's own groups" if torchrun else "virtual world")
        report.print_report(console, result.scenario, verdicts,
                            title=f"{run.scenario.name} on {result.release} host classes ({where})")
        # the release's contract: each path not in the release (n/a), and for a release cpsim's table does
        # not list, whose contract judged it and whether its files are the same
        for p, why in result.absent_paths.items():
            console.print(f"{p}: not in this release (n/a): {why}", highlight=False, soft_wrap=True)
        if held is not None and not held.listed:
            console.print(f"contract: {held.line()}", highlight=False, soft_wrap=True)
        console.print(f"stack: {result.release}; profile: {result.profile or 'cpsim'}; patches:", highlight=False)
        for line in result.patches:
            console.print(f"  - {line}", highlight=False, soft_wrap=True)
        if torchrun:
            console.print("ranks: " + "; ".join(f"torchrun rank {r['rank']} -> DCP rank {r['dcp_rank']} of "
                                                f"{r['dcp_world']}" if "dcp_rank" in r else
                                                f"torchrun rank {r['rank']}: {r['error']}" for r in torchrun["ranks"]),
                          highlight=False, soft_wrap=True)
    else:
        console.print("pass" if coordinator.passed(verdicts) else "FAIL")
        if held is not None and held.unread:
            console.print(f"contract: {held.line()}", highlight=False, soft_wrap=True)
    if write_reports:
        run.report.write(result.scenario, verdicts, {"stack": stack}, picture_note=NO_PICTURE)
    if not coordinator.passed(verdicts):
        return 1
    return releases.UNREAD_CHANGES_EXIT if held is not None and held.unread else 0


def contract_json(result) -> dict:
    """The --json's word on the release's contract: the paths not in it, whose contract judged it
    (docs/REPORT_SCHEMA.md ``stack.absent_paths``, ``stack.contract``)."""
    out: dict = {"absent_paths": dict(result.absent_paths)}
    if result.standing is not None:
        out["contract"] = result.standing.to_dict()
    return out


# ---- under torchrun -----------------------------------------------------------------------

def _rendezvous() -> str:
    """A TCP address for the runtime's own groups (rank 0's machine, a port free now): torchrun's own
    store stays cpsim's."""
    import os
    import socket
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{port}"


def main_torchrun(args) -> int:
    """One CP rank per torchrun rank: each rank's driver child joins the runtime's own process groups
    (:mod:`cpsim.stack.runtime_groups`: TP = the world, DCP = the scenario's) and drives the host
    objects of the DCP rank they give it; the ranks all-gather what came back and rank 0 judges each
    CP group (DCP groups of consecutive ranks, as vLLM lays them out at PCP 1; a world of several is
    TP > DCP, each DCP rank held by several TP ranks) as the virtual world's run is judged.
    Every wait is bounded: the groups' setup and each gather by --timeout, the host code by half of it
    (:func:`cpsim.stack.host.drive_rank`); a rank whose driver died or hung fails every path on that
    rank, named; a rank that never reaches the gather is named by the gather."""
    from cpsim.run.comm import Comm
    from cpsim.run.dist import Env, select_device
    from cpsim.stack import host

    run = StackRun.from_args(args)
    s, paths = run.scenario, run.paths
    env = Env.from_environ()
    torchrun_world(s.cp.world, f"the scenario (DCP {s.cp.dcp} x PCP {s.cp.pcp})", "--dcp/--pcp")
    host.stack_python(run.python)
    host.stack_source(run.source)
    dev = select_device(run.device, env.local_rank, env.local_world, run.oversubscribe)
    comm = Comm.init(env, dev, run.timeout, on_leave=run.runner.end)
    code = 1
    try:
        init_method = comm.all_gather_objects(_rendezvous() if comm.rank == 0 else None, "runtime rendezvous")[0]
        dist = {"rank": comm.rank, "world": comm.world, "init_method": init_method, "timeout_s": run.timeout}
        comm.state("driving the release's host classes")
        # the child's own bound: the groups' setup (--timeout), the host code (half of it), the imports
        mine = host.drive_rank(s, run.family, paths, dist, run.python, run.classes, run.source,
                               timeout=2 * run.timeout + 120)
        ranks = comm.all_gather_objects(mine, "the ranks' host-class results")
        code = _judge_world(run, ranks) if comm.rank == 0 else 0
    except BaseException as e:  # noqa: BLE001  (Comm.fail reports it to the peers and exits)
        title = f"{s.name} on --stack {run.family} host classes, torchrun world {env.world}"
        comm.fail(e, lambda message, named: rank0_writer(run.report, title, {}, 1)([], [], message, named))
    try:
        comm.finish(code)
    except BaseException as e:  # noqa: BLE001
        comm.fail(e)


def _judge_world(run: StackRun, ranks: list[dict]) -> int:
    """Rank 0: every CP group judged, reported, and the --json written; the exit code."""
    from rich.markup import escape

    from cpsim.stack import host
    try:
        groups = host.judge_ranks(run.scenario, run.family, run.paths, run.classes, run.source, run.profile, ranks)
    except ConfigError as e:
        Console(stderr=True).print(f"[bold red]error:[/bold red] {escape(str(e))}", highlight=False, soft_wrap=True)
        return 2
    if len(groups) == 1:
        return _report(run, groups[0][0], groups[0][1])
    codes = [_report(run, result, torchrun, write_reports=False) for result, torchrun in groups]
    _write_groups(run, groups, not any(c == 1 for c in codes))
    bad = sum(1 for c in codes if c == 1)
    Console().print(f"[bold red]{bad} of {len(groups)} CP group(s) fail[/bold red]" if bad else
                    f"[bold green]all {len(groups)} CP group(s) pass[/bold green]")
    return 1 if bad else max(codes)


def _write_groups(run: StackRun, groups: list[tuple], passed: bool) -> None:
    """Several CP groups: one --json holding each group's report, one JUnit suite and one page of them all."""
    world = sum(len(t["ranks"]) for _, t in groups)
    first = groups[0][0]
    stack = {"release": first.release, "profile": first.profile or "cpsim", "patches": first.patches,
             "torchrun_world": world, **contract_json(first)}
    items = [(f"CP group {i} (torchrun ranks {t['ranks'][0]['rank']}-{t['ranks'][-1]['rank']})", result.scenario,
              result.verdicts) for i, (result, t) in enumerate(groups)]
    files = run.report
    write_outputs([
        ("--json", files.json, lambda: report.write_json(files.json, {
            "passed": passed, "stack": stack,
            "cp_groups": [report.to_dict(result.scenario, result.verdicts, {"torchrun": torchrun})
                          for result, torchrun in groups]})),
        ("--junit", files.junit, lambda: write_junit(files.junit, [(s, v, label) for label, s, v in items])),
        ("--html", files.html, lambda: write_html_many(files.html, f"--stack {run.family} host classes on torchrun "
                                                                   f"world {world}", items, extra={"stack": stack}))])

"""Sub-commands of the ``cpsim`` CLI, one module each, and the options they share."""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path
from typing import Callable

from cpsim import scenario as sc
from cpsim.errors import ConfigError
from cpsim.kernels.under_test import BUILTIN  # --kernel-v1 builtin: cpsim's own (overrides a repro's recorded one)
from cpsim.paths import PATHS
from cpsim.run.dist import launched_by_torchrun
from cpsim.validate import check_world, load_scenario, write_outputs


def add_scenario_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scenario")
    g.add_argument("--scenario", default="default", metavar="NAME|FILE",
                   help=f"preset ({', '.join(sc.PRESETS)}) or a .json/.toml file (default: default)")
    g.add_argument("--dcp", type=int, help="decode context-parallel size (overrides the scenario)")
    g.add_argument("--pcp", type=int, help="prefill context-parallel size (overrides the scenario)")
    g.add_argument("--interleave", type=int, help="CP KV-cache interleave size (overrides the scenario)")
    g.add_argument("--seed", type=int, default=0, help="seed for the preset's batch and the allocator")
    g.add_argument("--allow-invalid", action="store_true",
                   help="run CP layouts that break the global owner rule, to see what breaks")
    g.add_argument("--allow-large", action="store_true",
                   help="run a CP world size above 64 in the virtual world (every rank in turn: minutes)")


class DefaultPaths(str):
    """--paths when the user did not give it: paths that do not apply are skipped quietly then."""


def add_path_args(p: argparse.ArgumentParser, default: str = ",".join(PATHS)) -> None:
    p.add_argument("--paths", default=DefaultPaths(default),
                   help=f"comma-separated paths to run, from {','.join(PATHS)} (default: {default})")


def parse_paths(text: str) -> list[str]:
    paths = [x.strip() for x in text.split(",")]
    if "" in paths and any(paths):
        raise ConfigError("--paths", f"{text!r} has an empty entry (two commas, or one at an end)")
    paths = [x for x in paths if x]
    bad = [x for x in paths if x not in PATHS]
    if bad or not paths:
        raise ConfigError("--paths", f"unknown path(s) {bad}; choose from {', '.join(PATHS)}")
    return paths


def scenario_from_args(args) -> sc.Scenario:
    name = args.scenario
    if name in sc.PRESETS:
        # The preset sizes its caches for the CP layout it is given.
        s = sc.preset(name, **{k: getattr(args, k, None) for k in ("dcp", "pcp", "interleave")}, seed=args.seed)
    elif Path(name).suffix in (".json", ".toml"):
        s = load_scenario(name)
    else:
        close = difflib.get_close_matches(name, sc.PRESETS, n=1)
        raise ConfigError("--scenario", f"{name!r} is neither a preset ({', '.join(sc.PRESETS)}) "
                                        f"nor a .json/.toml file" + (f"; did you mean {close[0]!r}?" if close else ""))
    return apply_overrides(s, args)


def apply_overrides(s: sc.Scenario, args) -> sc.Scenario:
    """The shared --dcp/--pcp/--interleave/--allow-invalid overrides, then validation."""
    cp = {k: getattr(args, k) for k in ("dcp", "pcp", "interleave") if getattr(args, k, None) is not None}
    if cp:
        import dataclasses
        s = s.replace(cp=dataclasses.replace(s.cp, **cp))
    if getattr(args, "allow_invalid", False):
        s = s.replace(allow_invalid=True)
    s = sc.validate(s)
    if not launched_by_torchrun():  # under torchrun every rank is a real process: no virtual-world cost
        check_world(s, getattr(args, "allow_large", False))
    return s


def not_applicable(s: sc.Scenario, path: str) -> str | None:
    """Why ``path`` does not run on ``s`` (the path returns no mapping), or None."""
    if path == "v1-fused" and s.cp.world > 1:
        return f"the v1-fused path runs at CP world size 1 only, this scenario has {s.cp.world}"
    return None


def check_paths_apply(scenarios: list[sc.Scenario], paths: list[str], args, explicit: bool | None = None) -> None:
    """A kernel, or an explicitly chosen path, that runs on none of ``scenarios`` is bad input, not a pass.

    ``explicit``: the user chose ``paths`` (default: --paths was given on the command line).
    """
    def nowhere(path: str) -> str | None:
        whys = [not_applicable(s, path) for s in scenarios]
        return whys[0] if whys and all(whys) else None

    for path, attr in KERNEL_FLAGS.items():
        spec = getattr(args, attr, None)
        why = nowhere(path) if spec and spec != BUILTIN and path in paths else None
        if why:
            raise ConfigError("--" + attr.replace("_", "-"), f"{why}: the kernel would never run")
    if getattr(args, "kernel_replay", None) not in (None, BUILTIN) and not any(s.batch.has_replay for s in scenarios):
        raise ConfigError("--kernel-replay", "no request of the scenario replays (batch.requests[].replay_start): "
                                             "the kernel would never run")
    if explicit is None:
        explicit = not isinstance(getattr(args, "paths", None), DefaultPaths)
    if explicit:
        for path in paths:
            why = nowhere(path)
            if why:
                raise ConfigError("--paths", f"{why}; drop {path} from --paths")
    if all(nowhere(p) for p in paths):
        raise ConfigError("--paths", f"none of {', '.join(paths)} runs on this scenario: nothing would be checked")


# ---- kernel under test -------------------------------------------------------

KERNEL_FLAGS = {"v1": "kernel_v1", "v1-fused": "kernel_v1_fused", "v2": "kernel_v2"}


def add_kernel_args(p: argparse.ArgumentParser) -> None:
    """``--kernel-v1/--kernel-v1-fused/--kernel-v2 SPEC``: the user's kernel replaces the built-in one."""
    from cpsim.kernels.under_test import ABIS, V2_LAUNCHES
    g = p.add_argument_group("kernel under test",
                             "SPEC is package.module:attr or path/to/file.py:attr; "
                             "'vllm' or 'ascend' (v1, v2) imports the installed release's kernel; "
                             "'builtin' is cpsim's own")
    g.add_argument("--kernel-v1", metavar="SPEC", help="kernel for the v1 path (vllm-ascend BlockTable)")
    g.add_argument("--kernel-v1-fused", metavar="SPEC", help="kernel for the v1-fused path (CP size 1 only)")
    g.add_argument("--kernel-v2", metavar="SPEC", help="kernel for the v2 path (vLLM BlockTables)")
    g.add_argument("--kernel-replay", metavar="SPEC",
                   help="prefix-cache replay-padding kernel run after every path's slot mapping "
                        "(vLLM _pad_replayed_slots_kernel signature)")
    g.add_argument("--kernel-abi", default="auto", choices=("auto", *ABIS),
                   help="calling convention (default: auto, from the kernel's parameter names)")
    g.add_argument("--kernel-v2-launch", default="split", choices=V2_LAUNCHES,
                   help="v2 ABIs have one CP size per launch: 'split' launches unsharded groups with CP_SIZE=1, "
                        "'single' launches every group with the CP size, as the runtime does (default: split)")
    g.add_argument("--shim-vllm", action="store_true",
                   help="provide vllm.triton_utils and _load_ptr from Triton so a kernel file loads without vLLM")
    g.add_argument("--kernel-timeout", type=float, metavar="SECONDS",
                   help="wall-clock bound of one rank's run of a path; kernels run in a worker process, and one "
                        "that raises, crashes, hangs past this or exits is a violation (default: --timeout, else 300; "
                        "under torchrun 3/4 of --timeout, so the report gets the failure before the peers' bound)")


def kernels_from_args(args, device: str = "cpu", paths: list[str] | None = None, base: dict | None = None) -> dict:
    """{path: KernelUnderTest} for each --kernel-* option given (empty when none), over ``base``.

    With ``paths``, a kernel for a path that will not run is an error, not a silent no-op.
    ``--kernel-replay`` goes with every path (``paths``, else all): the replay pass follows each.
    """
    from cpsim.kernels.under_test import load, with_replay
    out = dict(base or {})
    for path, attr in KERNEL_FLAGS.items():
        spec = getattr(args, attr, None)
        if spec == BUILTIN:
            continue
        if spec and paths is not None and path not in paths:
            raise ConfigError("--" + attr.replace("_", "-"), f"the {path} path is not selected (--paths {','.join(paths)})")
        if spec:
            k = load(spec, path, getattr(args, "kernel_abi", "auto"), shim_vllm=getattr(args, "shim_vllm", False),
                     device=device, v2_launch=getattr(args, "kernel_v2_launch", "split"),
                     where="--" + attr.replace("_", "-"))
            out[path] = with_replay(k, getattr(out.get(path), "replay", None))
    return _with_replay_kernel(args, device, paths, out)


def _with_replay_kernel(args, device: str, paths: list[str] | None, kernels: dict) -> dict:
    """``--kernel-replay SPEC`` attached to every path's entry; ``builtin`` drops a recorded one."""
    from cpsim.kernels.under_test import REPLAY, REPLAY_ABIS, load, with_replay
    spec = getattr(args, "kernel_replay", None)
    if not spec:
        return kernels
    replay = None
    if spec != BUILTIN:
        abi = getattr(args, "kernel_abi", "auto")
        replay = load(spec, REPLAY, abi if abi in REPLAY_ABIS else "auto",
                      shim_vllm=getattr(args, "shim_vllm", False), device=device, where="--kernel-replay")
    out = {}
    for path in dict.fromkeys([*(paths or PATHS), *kernels]):
        k = with_replay(kernels.get(path), replay)
        if k is not None:
            out[path] = k
    return out


def add_profile_arg(p: argparse.ArgumentParser, strict_sizing: bool = True) -> None:
    """``--profile NAME``, ``--sizing SPEC`` and ``--sizing-timeout`` (every command that judges);
    ``--strict-sizing`` (``run``)."""
    from cpsim.check import profiles
    from cpsim.run.sizing import TIMEOUT_S
    p.add_argument("--profile", metavar="NAME",
                   help=f"the runtime contract the oracle judges by ({', '.join(profiles.PROFILES)}; default: the "
                        f"loaded kernel's release (a repro's recorded one), else the --sizing release, builtin = "
                        f"cpsim; docs/SPEC.md §4.1)")
    if strict_sizing:
        p.add_argument("--strict-sizing", action="store_true",
                       help="also note tables wider and slot buffers larger than the profile's rule (waste; exit 0)")
    p.add_argument("--sizing", metavar="SPEC",
                   help="host sizing under test: table widths and slot-buffer length from a built-in release "
                        "(cpsim, vllm-0.33, vllm-ascend-0.23) or your function, path/to/file.py:fn or "
                        "package.module:fn, asked for every scenario (run in a child process; a repro's recorded "
                        "one unless this replaces it; docs/TESTING_YOUR_KERNEL.md §Host sizing)")
    p.add_argument("--sizing-timeout", type=float, default=TIMEOUT_S, metavar="SECONDS",
                   help=f"bound on the sizing function's answer for one scenario (default {TIMEOUT_S:g})")


def sizer_from_args(args, recorded: str = ""):
    """The ``cpsim.run.sizing.Sizer`` of ``--sizing`` (else of ``recorded``, a repro's ``sizing``), or None
    (cpsim's own sizing). A malformed SPEC or a file that is gone is exit 2 naming the field it came from."""
    from cpsim.run.sizing import TIMEOUT_S, Sizer
    spec, where = (getattr(args, "sizing", None), "--sizing") if getattr(args, "sizing", None) else (recorded, "repro.sizing")
    if not spec:
        return None
    return Sizer(spec, getattr(args, "sizing_timeout", TIMEOUT_S), where)


def profile_from_args(args, kernels: dict, recorded: str = ""):
    """``--profile NAME`` (exit 2 if unknown), else ``recorded`` (a repro file's), else the one the kernels'
    released ABIs imply, else the release a built-in ``--sizing`` names (cpsim for builtin)."""
    from cpsim.check import profiles
    name = getattr(args, "profile", None) or recorded
    if name:
        return profiles.get(name)
    implied = profiles.for_abis([k.abi for k in (kernels or {}).values()])
    sizing = getattr(args, "sizing", None)
    if implied.name == "cpsim" and sizing in profiles.PROFILES:
        return profiles.PROFILES[sizing]
    return implied


def show_profile(console, prof, s=None, paths=()) -> None:
    """``profile: NAME (releases)``, then what the profile leaves unjudged or lays out anew in ``s``."""
    from cpsim.check import profiles
    console.print(f"profile: {prof.name} ({prof.releases})", highlight=False, soft_wrap=True)
    for line in (profiles.notes(s, prof, paths) if s is not None else []):
        console.print(f"  [yellow]note (profile):[/yellow] {line}", highlight=False, soft_wrap=True)


def knobs_with_sizing(args, knobs, s, paths: list[str], sizer=None):
    """``knobs`` carrying what the sizing under test (``sizer``, else ``--sizing``'s) gives each host of
    ``s`` (unchanged without one). The user's function runs in a child process (``cpsim.run.sizing``);
    its failure is a ``SizingFailure`` (exit 1)."""
    own = sizer is None
    sizer = sizer or sizer_from_args(args)
    if sizer is None:
        return knobs
    import dataclasses
    try:
        return dataclasses.replace(knobs, host_sizing=sizer.answer(s, paths))
    finally:
        if own:
            sizer.close()


def sizing_failed(console, e: Exception, where: str = "") -> int:
    """The one line a command prints when the sizing under test failed (exit 1: a failure, not a pass)."""
    console.print(f"FAIL (--sizing){' ' + where if where else ''}: {e}", highlight=False, soft_wrap=True, markup=False)
    return 1


def describe_kernels(console, kernels: dict, notes_only: bool = False) -> None:
    """One line per kernel under test, then what its adapter could not model.

    ``notes_only``: the report's heading already named the kernels (``report.print_report``)."""
    for path, k in kernels.items():
        if not notes_only:
            console.print(f"kernel under test on {path}: {k.describe()}", highlight=False, soft_wrap=True)
        for note in k.notes:
            console.print(f"  [yellow]note:[/yellow] {note}", highlight=False, soft_wrap=True)


def kernels_with_record(args, record: dict, device: str, paths: list[str]) -> dict:
    """A repro file's recorded kernels on ``paths``, each replaced by the --kernel-* option given for its path."""
    from cpsim.kernels.under_test import from_record
    given = {p for p, attr in KERNEL_FLAGS.items() if getattr(args, attr, None)}
    # A replaced path kernel keeps its recorded replay kernel (--kernel-replay replaces that one).
    kept = {p: (v if p not in given else {"spec": BUILTIN, "replay": v["replay"]})
            for p, v in (record or {}).items()
            if p in paths and (p not in given or (isinstance(v, dict) and v.get("replay")))}
    out = from_record(kept, device, where="repro kernels")
    return kernels_from_args(args, device, paths, base=out)


def subjects_for(kernels: dict, paths, profile: str | None = None) -> dict:
    """What ran on each of ``paths``, as plain data for every report (``cpsim.kernels.subject``), with the
    release profile the oracle judged by (default: the one the kernels imply)."""
    from cpsim.check import profiles
    from cpsim.kernels.subject import subjects
    name = profile or profiles.for_abis([k.abi for k in (kernels or {}).values()]).name
    return subjects(kernels or {}, list(dict.fromkeys([*paths, *(kernels or {})])), name)


def _examples(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"--examples must be an integer >= 0, got {text!r}")
    return n


def add_report_args(p: argparse.ArgumentParser) -> None:
    """Options of the printed report."""
    from cpsim.report.report import DEFAULT_EXAMPLES
    p.add_argument("--examples", type=_examples, default=DEFAULT_EXAMPLES, metavar="N",
                   help=f"examples printed per failing invariant, paths that agree printed once "
                        f"(default: {DEFAULT_EXAMPLES}; --json has them all)")


# ---- torchrun ------------------------------------------------------------------

def torchrun_world(cp_size: int, what: str, field: str) -> int:
    """WORLD_SIZE, which must hold whole CP groups of ``cp_size`` ranks."""
    world = int(os.environ["WORLD_SIZE"])
    if world % cp_size:
        raise ConfigError(field, f"world size {world} is not a multiple of the CP size {cp_size} of {what}")
    return world


def execute_torchrun(args, entry, summary: Callable | None = None, extra: dict | None = None) -> int:
    """Check one ``distrun.Entry`` on every CP group of the torchrun world.

    Rank 0 prints the ranks, every group's report and the kernels under test, then
    ``summary(console, results)`` (a command's own verdict line), and writes the
    --json / --junit / --html files the command has. Exit 1 when any group fails.
    """
    from cpsim.report import terminal

    from cpsim.check import coordinator

    from cpsim.report import report
    from cpsim.report.torchrun import print_groups, to_dict
    from cpsim.run.distrun import execute, print_ranks

    world = int(os.environ["WORLD_SIZE"])
    quiet = getattr(args, "quiet", False)
    prof = entry.profile
    subjects = subjects_for(entry.kernels, entry.paths, prof.name if prof else None)

    def report_(results, infos) -> int:
        console = terminal.console()
        ok = all(coordinator.passed(r.verdicts) for r in results)
        s0 = results[0].scenario
        if quiet:
            console.print("pass" if ok else "FAIL")
        else:
            console.print(f"[bold]torchrun world {world}[/bold]: {world // entry.cp_size} CP group(s) of "
                          f"{entry.cp_size} (DCP {s0.cp.dcp} x PCP {s0.cp.pcp}), timeout {args.timeout:g} s")
            print_ranks(console, infos, results)
            print_groups(console, results, subjects, getattr(args, "examples", None))
            describe_kernels(console, entry.kernels, notes_only=True)
            if prof is not None:
                show_profile(console, prof, s0, entry.paths)
            console.print(f"[bold green]all {len(results)} CP group(s) pass[/bold green]" if ok else
                          f"[bold red]{sum(not coordinator.passed(r.verdicts) for r in results)} of "
                          f"{len(results)} CP group(s) fail[/bold red]")
        if summary is not None:
            summary(console, results)

        def junit() -> None:
            from cpsim.report.junit import write_junit
            write_junit(args.junit, [(r.scenario, r.verdicts, f"{r.label} group {r.group}") for r in results],
                        subjects=subjects)

        def html() -> None:
            from cpsim.report.html import write_html_many
            write_html_many(args.html, f"{entry.label} on torchrun world {world}",
                            [(f"{r.label} · CP group {r.group} (ranks {r.ranks[0]}-{r.ranks[-1]})", r.scenario,
                              r.verdicts) for r in results], extra=extra, subjects=subjects)

        try:  # every output that can be written is, even when another fails
            write_outputs([("--json", getattr(args, "json", None),
                            lambda: report.write_json(args.json, to_dict(results, infos, extra, subjects))),
                           ("--junit", getattr(args, "junit", None), junit),
                           ("--html", getattr(args, "html", None), html)])
        except ConfigError as e:
            terminal.console(stderr=True).print(f"[bold red]error:[/bold red] {e}", highlight=False, soft_wrap=True)
            return 2
        return 0 if ok else 1

    return execute(args, [entry], report_, stopped=stop_writer(args, f"{entry.label} on torchrun world {world}",
                                                                subjects, 1, extra))


def stop_writer(args, title: str, subjects: dict, planned: int, extra: dict | None = None) -> Callable:
    """What rank 0 calls when a torchrun job stops early (``distrun.execute``'s ``stopped``): the
    --json / --junit / --html files the command has, saying the run stopped, with rank 0's stop line,
    the ranks it names, and the CP groups finished so far; then one line naming the files."""
    from rich.markup import escape

    from cpsim.report import report, terminal
    from cpsim.report.torchrun import stopped_record, to_dict

    def write(results, infos, message: str, ranks: list[int]) -> None:
        world = int(os.environ.get("WORLD_SIZE", len(infos)))
        done = len({r.label for r in results})
        record = stopped_record(message, ranks, world, done, planned)
        items = [(r.scenario, r.verdicts, f"{r.label} group {r.group}") for r in results]

        def junit() -> None:
            from cpsim.report.junit import write_junit
            write_junit(args.junit, items, subjects=subjects, errors={"torchrun": message})

        def html() -> None:
            from cpsim.report.html import write_html_many
            write_html_many(args.html, title, [(f"{r.label} · CP group {r.group} (ranks {r.ranks[0]}-{r.ranks[-1]})",
                                                r.scenario, r.verdicts) for r in results],
                            extra=extra, subjects=subjects, stopped=message)

        outputs = [("--json", getattr(args, "json", None),
                    lambda: report.write_json(args.json, {**to_dict(results, infos, extra, subjects, record),
                                                          "world_size": world})),
                   ("--junit", getattr(args, "junit", None), junit),
                   ("--html", getattr(args, "html", None), html)]
        written = [path for _, path, _ in outputs if path]
        try:
            write_outputs(outputs)
        except ConfigError as e:
            written = []
            terminal.console(stderr=True).print(f"[bold red]error:[/bold red] {e}", highlight=False, soft_wrap=True)
        if written:
            named = ", ".join(f"rank {r}" for r in ranks) or "no rank"
            terminal.console(stderr=True).print(escape(f"[rank 0] the run stopped early; {', '.join(written)} "
                                                       f"say so ({named} named)"), highlight=False, soft_wrap=True)

    return write

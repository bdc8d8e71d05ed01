"""What a sub-command builds from its options, in one place: the scenario, the paths, the kernels
under test, the profile judging and the sizing under test (the lines that describe them: ``cmd.contracts``)."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
from pathlib import Path

from cpsim import scenario as sc
from cpsim.check import profiles
from cpsim.cmd.options import KERNEL_FLAGS, DefaultPaths
from cpsim.errors import ConfigError
from cpsim.kernels.under_test import BUILTIN  # --kernel-v1 builtin: cpsim's own (overrides a repro's recorded one)
from cpsim.kernels.under_test import REPLAY, REPLAY_ABIS, check_spec, from_record, load, with_replay
from cpsim.presets import PRESETS, preset
from cpsim.run.host_sizer import TIMEOUT_S, Sizer
from cpsim.run.torchrun_env import launched_by_torchrun
from cpsim.schema import PATH_NAMES as PATHS
from cpsim.validate import check_world, load_scenario



def kernel_runner(args):
    """The command's ``KernelRunner`` (``cpsim.run.runner``): ``cpsim.cli.main`` builds it from the options
    and hands it down on ``args``; ``args`` built by another caller (a test) get one here, kept on them for
    the rest of the command. Imported when kernels run: it brings torch."""
    if getattr(args, "kernel_runner", None) is None:
        from cpsim.run.runner import KernelRunner
        args.kernel_runner = KernelRunner()
    return args.kernel_runner


def worker_probe(args):
    """What reads a user's kernel SPEC: a worker of the command's kernel runner (``KernelRunner.probe``),
    never this process."""
    return kernel_runner(args).probe


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
    if name in PRESETS:
        # The preset sizes its caches for the CP layout it is given.
        s = preset(name, **{k: getattr(args, k, None) for k in ("dcp", "pcp", "interleave")}, seed=args.seed)
    elif Path(name).suffix in (".json", ".toml"):
        s = load_scenario(name)
    else:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        raise ConfigError("--scenario", f"{name!r} is neither a preset ({', '.join(PRESETS)}) "
                                        f"nor a .json/.toml file" + (f"; did you mean {close[0]!r}?" if close else ""))
    return apply_overrides(s, args)


def apply_overrides(s: sc.Scenario, args) -> sc.Scenario:
    """The shared --dcp/--pcp/--interleave/--allow-invalid overrides, then validation."""
    cp = {k: getattr(args, k) for k in ("dcp", "pcp", "interleave") if getattr(args, k, None) is not None}
    if cp:
        s = s.replace(cp=dataclasses.replace(s.cp, **cp))
    if getattr(args, "allow_invalid", False):
        s = s.replace(allow_invalid=True)
    s = sc.validate(s)
    if not launched_by_torchrun():  # under torchrun every rank is a real process: no virtual-world cost
        check_world(s, getattr(args, "allow_large", False))
    return s


def check_run_inputs(args) -> None:
    """``cpsim run``'s scenario and paths, built and checked before its module (and torch) is imported, so a
    bad one is exit 2 at once; ``cmd.run`` builds them again (cached: well under a millisecond).
    ``--stack`` has path rules of its own and under torchrun the world sizes the CP groups: there only
    the scenario is checked here."""
    s = scenario_from_args(args)
    if not getattr(args, "stack", None) and not launched_by_torchrun():
        paths = parse_paths(args.paths)
        check_paths_apply([s], paths, args)
        check_kernel_specs(args, paths)
    if getattr(args, "inject_on_rank", None) is not None and not args.inject:
        raise ConfigError("--inject-on-rank", "needs --inject NAME")
    if args.profile:
        profiles.get(args.profile)


def check_kernel_specs(args, paths: list[str]) -> None:
    """What the ``--kernel-*`` options can be told without loading a kernel: its path is selected, its SPEC
    has the form and its file exists (``under_test.check_spec``); the errors ``kernels_from_args`` raises
    first, here before torch loads."""
    for path, attr in KERNEL_FLAGS.items():
        spec, where = getattr(args, attr, None), "--" + attr.replace("_", "-")
        if not spec or spec == BUILTIN:
            continue
        if path not in paths:
            raise ConfigError(where, f"the {path} path is not selected (--paths {','.join(paths)})")
        check_spec(spec, path, where)
    spec = getattr(args, "kernel_replay", None)
    if spec and spec != BUILTIN:
        check_spec(spec, REPLAY, "--kernel-replay")


def check_fuzz_inputs(args) -> None:
    """``cpsim fuzz``: every value checked before any work starts (exit 2, one line), and before torch loads
    (``--list-faults`` only lists)."""
    if args.list_faults:
        return
    check_kernel_specs(args, parse_paths(args.paths))
    if args.max_examples is not None and args.max_examples < 1:
        raise ConfigError("--max-examples", f"must be an integer >= 1, got {args.max_examples}")
    if args.minutes is not None and not (math.isfinite(args.minutes) and args.minutes > 0):
        raise ConfigError("--minutes", f"must be a number > 0, got {args.minutes}")
    if args.seed is not None and args.seed < 0:
        raise ConfigError("--seed", f"must be an integer >= 0, got {args.seed}")
    if args.jobs < 1:
        raise ConfigError("--jobs", f"must be an integer >= 1, got {args.jobs}")
    if args.jobs > 1 and args.device != "cpu":
        raise ConfigError("--jobs", "worker processes are for --device cpu; one process drives a device "
                                    "(use launch/local.sh N fuzz for several devices)")
    if args.max_programs < 1:
        raise ConfigError("--max-programs", f"must be an integer >= 1, got {args.max_programs}")
    if not (math.isfinite(args.shrink_seconds) and args.shrink_seconds >= 0):
        raise ConfigError("--shrink-seconds", f"must be a number >= 0, got {args.shrink_seconds}")


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


def kernels_from_args(args, device: str = "cpu", paths: list[str] | None = None, base: dict | None = None) -> dict:
    """{path: KernelUnderTest} for each --kernel-* option given (empty when none), over ``base``.

    With ``paths``, a kernel for a path that will not run is an error, not a silent no-op.
    ``--kernel-replay`` goes with every path (``paths``, else all): the replay pass follows each.
    """
    out = dict(base or {})
    probe = worker_probe(args)
    for path, attr in KERNEL_FLAGS.items():
        spec = getattr(args, attr, None)
        if spec == BUILTIN:
            continue
        if spec and paths is not None and path not in paths:
            raise ConfigError("--" + attr.replace("_", "-"), f"the {path} path is not selected (--paths {','.join(paths)})")
        if spec:
            k = load(spec, path, getattr(args, "kernel_abi", "auto"), shim_vllm=getattr(args, "shim_vllm", False),
                     device=device, v2_launch=getattr(args, "kernel_v2_launch", "split"),
                     where="--" + attr.replace("_", "-"), inspect=probe)
            out[path] = with_replay(k, getattr(out.get(path), "replay", None))
    spec = getattr(args, "kernel_replay", None)
    if not spec:
        return out
    # --kernel-replay SPEC: attached to every path's entry; builtin drops a recorded one
    replay = None
    if spec != BUILTIN:
        abi = getattr(args, "kernel_abi", "auto")
        replay = load(spec, REPLAY, abi if abi in REPLAY_ABIS else "auto",
                      shim_vllm=getattr(args, "shim_vllm", False), device=device, where="--kernel-replay",
                      inspect=probe)
    kernels, out = out, {}
    for path in dict.fromkeys([*(paths or PATHS), *kernels]):
        k = with_replay(kernels.get(path), replay)
        if k is not None:
            out[path] = k
    return out


def sizer_from_args(args, recorded: str = ""):
    """The ``cpsim.run.host_sizer.Sizer`` of ``--sizing`` (else of ``recorded``, a repro's ``sizing``), or None
    (cpsim's own sizing). A malformed SPEC or a file that is gone is exit 2 naming the field it came from."""
    spec, where = (getattr(args, "sizing", None), "--sizing") if getattr(args, "sizing", None) else (recorded, "repro.sizing")
    if not spec:
        return None
    return Sizer(spec, getattr(args, "sizing_timeout", TIMEOUT_S), where)


def profile_from_args(args, kernels: dict, recorded: str = ""):
    """``--profile NAME`` (exit 2 if unknown), else ``recorded`` (a repro file's), else the one the kernels'
    released ABIs imply, else the release a built-in ``--sizing`` names (cpsim for builtin)."""
    name = getattr(args, "profile", None) or recorded
    if name:
        return profiles.get(name)
    implied = profiles.for_abis([k.abi for k in (kernels or {}).values()])
    sizing = getattr(args, "sizing", None)
    if implied.name == "cpsim" and sizing in profiles.PROFILES:
        return profiles.PROFILES[sizing]
    return implied


def knobs_with_sizing(args, knobs, s, paths: list[str], sizer=None):
    """``knobs`` carrying what the sizing under test (``sizer``, else ``--sizing``'s) gives each host of
    ``s`` (unchanged without one). The user's function runs in a child process (``cpsim.run.host_sizer``);
    its failure is a ``SizingFailure`` (exit 1)."""
    own = sizer is None
    sizer = sizer or sizer_from_args(args)
    if sizer is None:
        return knobs
    try:
        return dataclasses.replace(knobs, host_sizing=sizer.answer(s, paths))
    finally:
        if own:
            sizer.close()


def sizing_failed(console, e: Exception, where: str = "") -> int:
    """The one line a command prints when the sizing under test failed (exit 1: a failure, not a pass)."""
    console.print(f"FAIL (--sizing){' ' + where if where else ''}: {e}", highlight=False, soft_wrap=True, markup=False)
    return 1


def kernels_with_record(args, record: dict, device: str, paths: list[str]) -> dict:
    """A repro file's recorded kernels on ``paths``, each replaced by the --kernel-* option given for its path."""
    given = {p for p, attr in KERNEL_FLAGS.items() if getattr(args, attr, None)}
    # A replaced path kernel keeps its recorded replay kernel (--kernel-replay replaces that one).
    kept = {p: (v if p not in given else {"spec": BUILTIN, "replay": v["replay"]})
            for p, v in (record or {}).items()
            if p in paths and (p not in given or (isinstance(v, dict) and v.get("replay")))}
    out = from_record(kept, device, where="repro kernels", inspect=worker_probe(args))
    return kernels_from_args(args, device, paths, base=out)


def torchrun_world(cp_size: int, what: str, field: str) -> int:
    """WORLD_SIZE, which must hold whole CP groups of ``cp_size`` ranks."""
    world = int(os.environ["WORLD_SIZE"])
    if world % cp_size:
        raise ConfigError(field, f"world size {world} is not a multiple of the CP size {cp_size} of {what}")
    return world


def replica_builder(args, world: int | None):
    """``(build, build(0))``: ``build(replica)`` is the scenario of CP group ``replica`` (seed + replica), CP
    sized for ``world`` (``--dcp`` not given: the world over PCP)."""
    base = scenario_from_args(args)
    if world is not None and args.dcp is None:
        pcp = base.cp.pcp
        if world % pcp:
            raise ConfigError("--pcp", f"world size {world} is not a multiple of PCP {pcp}")
        args = copy.copy(args)
        args.dcp = world // pcp
        base = scenario_from_args(args)
    is_file = args.scenario not in PRESETS

    def build(replica: int) -> sc.Scenario:
        a = copy.copy(args)
        if not is_file:
            a.seed = args.seed + replica
        s = scenario_from_args(a)
        return s.replace(seed=s.seed + replica) if is_file else s

    return build, base  # build(0) is base

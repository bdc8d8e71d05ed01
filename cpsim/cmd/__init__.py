"""Sub-commands of the ``cpsim`` CLI, one module each, and the options they share."""

from __future__ import annotations

import argparse
from pathlib import Path

from cpsim import scenario as sc
from cpsim.errors import ConfigError
from cpsim.paths import PATHS


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


def add_path_args(p: argparse.ArgumentParser, default: str = ",".join(PATHS)) -> None:
    p.add_argument("--paths", default=default,
                   help=f"comma-separated paths to run, from {','.join(PATHS)} (default: {default})")


def parse_paths(text: str) -> list[str]:
    paths = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in paths if x not in PATHS]
    if bad or not paths:
        raise ConfigError("--paths", f"unknown path(s) {bad}; choose from {', '.join(PATHS)}")
    return paths


def scenario_from_args(args) -> sc.Scenario:
    name = args.scenario
    if name in sc.PRESETS:
        s = sc.preset(name, seed=args.seed)
    elif Path(name).suffix in (".json", ".toml"):
        s = sc.load(name)
    else:
        raise ConfigError("--scenario", f"{name!r} is neither a preset ({', '.join(sc.PRESETS)}) "
                                        f"nor a .json/.toml file")
    cp = {k: getattr(args, k) for k in ("dcp", "pcp", "interleave") if getattr(args, k, None) is not None}
    if cp:
        import dataclasses
        s = s.replace(cp=dataclasses.replace(s.cp, **cp))
    if getattr(args, "allow_invalid", False):
        s = s.replace(allow_invalid=True)
    return sc.validate(s)

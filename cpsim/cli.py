"""Command line: ``cpsim <command> ...`` (also ``python -m cpsim``).

Exit codes: 0 every invariant holds, 1 a violation was found, 2 bad input.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rich.console import Console

from cpsim import __version__
from cpsim.errors import ConfigError, DistError

# Each module registers one sub-command through ``register(subparsers)``.
COMMANDS = (
    "cpsim.cmd.run",
    "cpsim.cmd.sweep",
    "cpsim.cmd.draw",
    "cpsim.cmd.fuzz",
    "cpsim.cmd.replay",
    "cpsim.cmd.bugs",
    "cpsim.cmd.ascend_check",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cpsim", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"cpsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    err = Console(stderr=True)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        err.print(f"[bold red]error:[/bold red] {e}", highlight=False)
        return 2
    except DistError as e:
        err.print(f"[bold red]distributed run failed:[/bold red] {e}", highlight=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())

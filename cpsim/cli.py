"""Command line: `cpsim <command> ...` (also `python -m cpsim`).

Exit codes: 0 every invariant holds, 1 a violation was found, 2 bad input, 3 an internal error
(a fuzz job process raised or died), 130 / 143 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from rich.markup import escape

from cpsim import STARTED, __version__
from cpsim.startup import hold_signals
from cpsim.cmd.commands import COMMANDS
from cpsim.errors import ConfigError, DistError, Interrupted
from cpsim.report import terminal
from cpsim.report.terminal import FORMATS
from cpsim.validate import check_args
from cpsim.cmd.options import KERNEL_FLAGS
from cpsim.kernels.under_test import BUILTIN
from cpsim.run import reaper
from cpsim.run.boot import HeadStart, pool_size
from cpsim.run.torchrun_env import launched_by_torchrun


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (exit 2 as before); sub-parsers inherit it."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


FORMAT_HELP = ("rich: colour and box tables on a terminal, wide unfolded lines elsewhere (default); "
               "plain: no colour, ASCII tables, for logs")


def _leaves(parser: argparse.ArgumentParser):
    """Every parser that runs a command (sub-commands of sub-commands included)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield parser
    for a in subs:
        for p in dict.fromkeys(a.choices.values()):
            yield from _leaves(p)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="cpsim", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"cpsim {__version__}")
    parser.add_argument("--format", choices=FORMATS, default="rich", help=FORMAT_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    for leaf in _leaves(parser):  # `cpsim run --format plain` as well as `cpsim --format plain run`
        if leaf is not parser:
            leaf.add_argument("--format", choices=FORMATS, default=argparse.SUPPRESS, help=FORMAT_HELP)
    return parser


def command(spec: str):
    """The function that runs a sub-command, ``module:function`` (``cpsim.cmd.commands``): its module is
    imported only now, after the options were read and checked, since it imports torch."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def workers_ahead(args) -> int:
    """The kernel workers ``cpsim run`` is sure to use, started before the command imports torch (seconds),
    so that they import torch and cpsim on the other core meanwhile (``cpsim.run.boot.HeadStart``): its pool,
    or under torchrun the one worker a user's kernel runs in; none for the other commands, which may need none.
    ``--device auto`` counts as CPU (the device is known only once torch is imported)."""
    if args.command != "run" or getattr(args, "stack", None) or os.environ.get("CPSIM_KERNEL_ISOLATION") == "0":
        return 0
    if launched_by_torchrun():
        return int(any(getattr(args, a, None) not in (None, BUILTIN) for a in KERNEL_FLAGS.values()))
    return pool_size(args.device if args.device in ("cpu", "cuda", "npu") else "cpu")


def _raise_interrupted(signum, frame) -> None:
    """The first SIGTERM unwinds the command; later ones (a kernel may send one per call) are let pass,
    so the unwinding itself (summary, report, the reaper ending the workers) is never cut short."""
    import signal
    signal.signal(signum, _already_ending)
    raise Interrupted(signum)


def _already_ending(signum, frame) -> None:
    """A signal that arrives while cpsim is already ending on an earlier one: nothing more to do."""


def _interrupted(args, signum: int, started: float, err, wrote: list[str] | None = None) -> int:
    """One line; the --json file, unless the command wrote it already, says the run was interrupted
    (never a pass); ``wrote``: what the command itself kept (fuzz: its summary and repros so far);
    exit 130 for SIGINT, 143 for SIGTERM."""
    import json
    import signal
    import time
    name = signal.Signals(signum).name
    wrote = list(wrote or [])
    path = getattr(args, "json", None)
    if path and os.environ.get("RANK", "0") == "0":  # under torchrun rank 0 writes the report
        try:
            if not os.path.exists(path) or os.path.getmtime(path) < started:
                with open(path, "w") as f:
                    json.dump({"passed": False, "interrupted": name, "command": args.command,
                               "finished_at": time.time()}, f, indent=2)
                wrote.append(path)
        except OSError:
            pass
    err.print(f"[bold red]interrupted:[/bold red] {name}; stopped before the end"
              + (f"; {', '.join(wrote)} say{'s' if len(wrote) == 1 else ''} so" if wrote else ""),
              highlight=False, soft_wrap=True)
    return 128 + signum


def main(argv: list[str] | None = None, held: tuple | None = None, runner=None) -> int:
    """``held``: (signals kept so far, the handlers they replaced) where ``python -m cpsim`` started keeping
    them before its imports; else they are kept from here. ``runner``: the ``KernelRunner`` the command's
    kernels run on, configured from its options (a long-lived caller's, such as the test suite's: its workers
    stay warm across commands); none: one of the command's own, ended when it returns."""
    import signal
    import time
    started = STARTED if held is not None else time.time()
    # Until the options are known (the imports of every command: seconds on a loaded box), a SIGTERM or
    # Ctrl-C is kept, then answered like one during the run, so --json still says so (a torchrun rank
    # whose peer died at start-up is stopped right here).
    pending, held = held if held is not None else hold_signals()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # a torchrun rank ends with its agent
        reaper.end_with_parent()
        # c10d's warnings with C++ frames when the agent's store is gone; each rank's own line says why
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, a usage error: the code argparse chose, returned
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        for s, old in held.items():
            signal.signal(s, _raise_interrupted if s == signal.SIGTERM else old)
    terminal.set_format(getattr(args, "format", "rich"))
    err = terminal.console(stderr=True)
    if pending:
        return _interrupted(args, pending[0], started, err)
    kernels = None  # the command's KernelRunner, handed down on args.kernel_runner
    try:
        check_args(args)  # option bounds and output paths, before any work
        if getattr(args, "check_inputs", None):
            args.check_inputs(args)  # the command's own inputs (scenario, paths): still without torch
        ahead = HeadStart(workers_ahead(args)) if runner is None else None
        from cpsim.run.runner import KernelRunner
        kernels = args.kernel_runner = KernelRunner(head_start=ahead) if runner is None else runner
        kernels.configure_from_args(args)
        reaper.become_subreaper()  # a kernel's setsid() child still ends with cpsim
        return int(command(args.func)(args) or 0)
    except ConfigError as e:
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun: every rank ends together, one line
            from cpsim.run.dist import end_on_bad_input
            end_on_bad_input(f"error: {e}", getattr(args, "timeout", None),
                             before_exit=None if kernels is None else kernels.end)
        err.print(f"[bold red]error:[/bold red] {escape(str(e))}", highlight=False, soft_wrap=True)
        return 2
    except DistError as e:
        err.print(f"[bold red]distributed run failed:[/bold red] {escape(str(e))}", highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt as e:
        return _interrupted(args, signal.SIGINT, started, err, getattr(e, "wrote", None))
    except Interrupted as e:
        return _interrupted(args, e.signum, started, err, getattr(e, "wrote", None))
    finally:
        if kernels is not None:  # what a dead worker's kernel left, found by its marker (cpsim.run.reaper)
            kernels.sweep_escaped()
        if kernels is not None and runner is None:
            kernels.close()


if __name__ == "__main__":
    sys.exit(main())

"""The signals cpsim keeps while it starts: a SIGTERM or Ctrl-C before the options are known (cpsim's
imports take seconds on a loaded box; a torchrun rank whose peer died at start-up gets one then) is
answered by ``cli.main`` like one during the run, so a requested --json still says so."""

import signal


def hold_signals() -> tuple[list[int], dict]:
    """(the signals received from now on, the handlers they replaced); only default handlers are replaced."""
    pending: list[int] = []
    before = {s: signal.signal(s, lambda signum, frame: pending.append(signum))
              for s in (signal.SIGTERM, signal.SIGINT)
              if signal.getsignal(s) in (signal.SIG_DFL, signal.default_int_handler)}
    return pending, before

"""`python -m cpsim`. A SIGTERM or Ctrl-C during cpsim's own imports (seconds on a loaded box; a torchrun
rank whose peer died at start-up gets one then) is kept from the first line and answered by ``cli.main``
like one during the run, so a requested --json still says so."""

import signal

pending: list[int] = []
before = {s: signal.signal(s, lambda signum, frame: pending.append(signum))
          for s in (signal.SIGTERM, signal.SIGINT)
          if signal.getsignal(s) in (signal.SIG_DFL, signal.default_int_handler)}

from cpsim.cli import main  # noqa: E402  (after the handlers: its imports are what they cover)

raise SystemExit(main(held=(pending, before)))

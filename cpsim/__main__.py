"""`python -m cpsim`: signals are kept from the first line, before cpsim's own imports (cpsim.startup)."""

from cpsim.startup import hold_signals

held = hold_signals()

from cpsim.cli import main  # noqa: E402  (after the handlers: its imports are what they cover)

raise SystemExit(main(held=held))

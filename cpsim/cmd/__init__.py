"""Sub-commands of the ``cpsim`` CLI, one module each; the options they share (``options``), what they
build from them (``inputs``) and their torchrun jobs (``torchrun_job``)."""

"""What the other layers name of kernel isolation, in one place: the runner (``KernelRunner``, built by
the caller and handed down; ``given`` where a call may have none), its settings, what it raises.

Why kernels run in worker processes, and how: ``cpsim.run.runner``.
"""

from __future__ import annotations

from cpsim.run.ahead import DEPTH  # noqa: F401  (re-exported: fuzz keeps as many scenarios drawn ahead)
from cpsim.run.outcome import KernelFailed  # noqa: F401  (re-exported: what the callers catch)
from cpsim.run.runner import DEFAULT_TIMEOUT_S, Isolation, KernelRunner, given  # noqa: F401  (re-exported)
from cpsim.run.boot import pool_size, usable_cores  # noqa: F401  (re-exported)

"""Capture the real slot-mapping launches of a process; replay them across ranks in cpsim.

Two ways in::

    # in code (a test, a worker): every launch of the named kernels inside the block is recorded
    from cpsim import capture
    with capture.capture("/tmp/cap", every=1):
        ...

    # a live server: CPSIM_CAPTURE=/tmp/cap plus, early in each worker (or in sitecustomize.py)
    import cpsim.capture; cpsim.capture.install()

Kernels are patched at the module attribute the caller looks up at launch time
(``module:attr``); modules not imported yet are patched the moment they are.
With ``CPSIM_CAPTURE`` unset ``install()`` returns at once and nothing is
wrapped: capture off costs nothing. Files: ``<dir>/rank<R>.cpcap``, one per rank.
See docs/CAPTURE.md.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

if TYPE_CHECKING:
    from cpsim.capture.recorder import Recorder
    from cpsim.capture.session import Session

from cpsim import recording
from cpsim.errors import ConfigError

# Imported on first use, so that ``import cpsim.capture; install()`` with capture off (a
# sitecustomize.py in every process) loads nothing beyond this module.
_LAZY = {"CapturedKernel", "Policy", "Recorder", "wrap"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from cpsim.capture import recorder
        return getattr(recorder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["KNOWN_HOSTS", "KNOWN_KERNELS", "CapturedKernel", "Policy", "Recorder", "capture", "install", "uninstall", "wrap",
           "active"]

# Where the kernels cpsim knows are looked up at launch time (module:attr): cpsim's own and the
# module-level kernels of the releases read for docs/UPSTREAM_ABIS.md (vLLM 0.18-0.33, vllm-ascend
# 0.18-0.23). vLLM 0.29+'s v1 kernel is a launcher's static method, which launch-time lookup does not see.
KNOWN_KERNELS = (
    "cpsim.kernels.triton_v1:_compute_slot_mapping_kernel",
    "cpsim.kernels.triton_v2:_compute_slot_mappings_kernel",
    "vllm.v1.worker.block_table:_compute_slot_mapping_kernel",
    "vllm.v1.worker.gpu.block_table:_compute_slot_mappings_kernel",
    "vllm_ascend.worker.block_table:_compute_slot_mapping_kernel",
    "vllm_ascend.worker.v2.block_table:_compute_slot_mappings_kernel",
)

# The host classes whose compute_slot_mapping(s) can be wrapped (module:Class.method; cpsim.capture.hosts):
# their own state after each call is recorded (tables, live block counts, slot buffers, CP rank).
KNOWN_HOSTS = (
    "vllm.v1.worker.block_table:MultiGroupBlockTable.compute_slot_mapping",
    "vllm.v1.worker.gpu.block_table:BlockTables.compute_slot_mappings",
    "vllm_ascend.worker.block_table:MultiGroupBlockTable.compute_slot_mapping",
)

_active: "Session | None" = None


def active() -> Recorder | None:
    """The recorder of the running capture, if any (e.g. to mark steps with ``active().step(n)``)."""
    return recording.active()


@contextmanager
def capture(directory: str | Path, kernels: Iterable[str] = KNOWN_KERNELS, *, every: int = 1,
            steps: str | tuple[int, int | None] | None = None, budget: int | str = "1G", rank: int | None = None,
            meta: dict[str, Any] | None = None) -> Iterator[Recorder]:
    """Record the launches of ``kernels`` (``module:attr``) made inside the block.

    ``meta`` may give what kernel arguments do not carry (``max_model_len``,
    ``max_num_batched_tokens``, ``max_num_reqs``, ``num_speculative_tokens``,
    ``num_blocks`` per group, ``group_names``); replay infers the rest.
    """
    from cpsim.capture.session import Session  # numpy (the recorder's): not for an idle install()
    global _active
    if _active is not None:
        raise ConfigError("capture", "a capture is already running in this process")
    session = Session.from_args(directory, kernels, every, steps, budget, rank, meta)
    session.start()
    _active = session
    recording.set_active(session.recorder)
    try:
        yield session.recorder
    finally:
        session.stop()
        _active = None
        recording.set_active(None)


def install(env=os.environ) -> Recorder | None:
    """The ``CPSIM_CAPTURE=dir`` switch: start capturing for the rest of the process; no-op when unset.

    Also read: ``CPSIM_CAPTURE_EVERY``, ``CPSIM_CAPTURE_STEPS`` (``a..b``),
    ``CPSIM_CAPTURE_BUDGET`` (``512M``), ``CPSIM_CAPTURE_RANK`` (this process's rank when
    torch.distributed is not initialised), ``CPSIM_CAPTURE_RANKS`` (``0-3``: record these ranks only),
    ``CPSIM_CAPTURE_KERNELS`` (extra ``module:attr``, comma-separated; ``module:Class.method`` wraps a
    host class), ``CPSIM_CAPTURE_HOSTS=1`` (also wrap the host classes of ``KNOWN_HOSTS``),
    ``CPSIM_CAPTURE_META`` (JSON, see :func:`capture`).
    """
    global _active
    directory = env.get("CPSIM_CAPTURE", "")
    if not directory:
        return None
    if _active is not None:
        return _active.recorder
    from cpsim.capture.session import Session  # numpy (the recorder's): only once capture is on
    extra = [k.strip() for k in env.get("CPSIM_CAPTURE_KERNELS", "").split(",") if k.strip()]
    hosts = list(KNOWN_HOSTS) if env.get("CPSIM_CAPTURE_HOSTS", "") not in ("", "0") else []
    session = Session.from_env(env, list(KNOWN_KERNELS) + extra + hosts)
    session.start()
    _active = session
    recording.set_active(session.recorder)
    return session.recorder


def uninstall() -> None:
    global _active
    if _active is not None:
        _active.stop()
        _active = None
        recording.set_active(None)

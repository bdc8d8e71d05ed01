"""The bug catalogue (SPEC §5): real CP slot-mapping bugs as injectable faults.

Each fault is a set of :class:`cpsim.paths.Knobs` (the deviation from the correct
runtime), the smallest scenario that makes it visible, and the invariants the
coordinator is expected to report. ``Knobs()`` is the fixed form of every fault.
"""

from __future__ import annotations

from cpsim.errors import ConfigError
from cpsim.faults.catalogue import FAULTS
from cpsim.faults.fault import Fault  # noqa: F401  (re-exported)


def registry() -> dict[str, Fault]:
    return {f.name: f for f in FAULTS}


def names() -> list[str]:
    return list(registry())


def get(name: str, field: str = "fault") -> Fault:
    reg = registry()
    if name not in reg:
        raise ConfigError(field, f"unknown fault {name!r}; known faults: {', '.join(reg)}")
    return reg[name]

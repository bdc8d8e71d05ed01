"""Frozen dataclass trees as plain dicts, tuples and atoms: ``dataclasses.asdict`` without its generic walk.

Kept apart from the scenario module, which only calls it (``Scenario.to_dict``)."""

from __future__ import annotations

import copy
import dataclasses

_ATOMS = (int, str, bool, float, type(None))
_FIELDS: dict[type, tuple[str, ...]] = {}


def plain(x):
    """``dataclasses.asdict(x)``, the same value, without its generic walk: fuzz fingerprints every
    scenario it draws (a drawn scenario's fingerprint: 0.05 -> 0.03 ms; ``scripts/bench_parent.py``).
    Scenario data is frozen dataclasses, tuples and immutable atoms; anything else is copied as
    ``asdict`` copies it (tests/test_scenario.py compares the two on drawn scenarios)."""
    if type(x) in _ATOMS:
        return x
    if type(x) in (tuple, list):
        return type(x)(plain(v) for v in x)
    names = _FIELDS.get(type(x))
    if names is not None:
        return {n: plain(getattr(x, n)) for n in names}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        _FIELDS[type(x)] = tuple(f.name for f in dataclasses.fields(x))
        return plain(x)
    if isinstance(x, dict):
        return type(x)((plain(k), plain(v)) for k, v in x.items())
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a named tuple
        return type(x)(*[plain(v) for v in x])
    if isinstance(x, (list, tuple)):
        return type(x)(plain(v) for v in x)
    return copy.deepcopy(x)

"""Hypothesis for the fuzzer: the scenario strategy, one round of Hypothesis over a job's searcher,
and the failure types it tells bugs apart by. Both explorers use them (``cpsim.fuzz.search`` and the
plain-random ``cpsim.fuzz.explore``)."""

from __future__ import annotations

import hashlib
import unittest
from pathlib import Path

from cpsim.errors import ConfigError
from cpsim.fuzz import space as _space

SEED_STRIDE = 1_000_003  # seed streams of jobs / ranks: seed + stream * SEED_STRIDE + round


def scenarios(allow_invalid: bool = False, max_programs: int = 48, max_tokens_per_request: int = 24,
              max_world: int = 16, space: str = "default", int32_slots: bool = False):
    """Hypothesis strategy of scenarios that ``scenario.validate`` accepts (``space.build``)."""
    return _space.strategy(_space.build, allow_invalid, max_programs, max_tokens_per_request, max_world, space,
                           int32_slots)


class SignatureFailure(AssertionError):
    """Raised for one signature; a subclass per signature, so Hypothesis keeps each bug apart
    (it tells failures apart by exception type and line) and shrinks each on its own."""

    signature = ""


_FAILURE_TYPES: dict[str, type] = {}


def _failure_type(sig: str) -> type:
    if sig not in _FAILURE_TYPES:
        name = "Sig_" + hashlib.sha256(sig.encode()).hexdigest()[:12]
        _FAILURE_TYPES[sig] = type(name, (SignatureFailure,), {"signature": sig})
    return _FAILURE_TYPES[sig]


def _hypothesis():
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise ConfigError("fuzz", "Hypothesis is not installed: pip install -e .[fuzz]") from None
    import hypothesis
    return hypothesis


def hypothesis_round(me, strategy, db, budget: int, phases, seed: int | None) -> int:
    """One run of Hypothesis over ``me.check`` (``me``: a job's ``cpsim.fuzz._Searcher``); marks the signatures it shrank and reported as done.
    Returns the number of scenarios it ran."""
    hypothesis = _hypothesis()
    from hypothesis import HealthCheck, Verbosity, given, settings

    cfg = me.cfg
    before = me.prog.examples
    me.shrink_until = None
    test = settings(
        max_examples=budget, database=db, deadline=None, derandomize=False, verbosity=Verbosity.quiet,
        phases=phases, suppress_health_check=list(HealthCheck),
        report_multiple_bugs=not cfg.stop_after_first, print_blob=False,
    )(given(strategy)(me.check))
    if seed is not None:
        test = hypothesis.seed(seed)(test)
    try:
        test()
    except unittest.SkipTest:
        pass  # nothing to run: a replay-only round over an empty database
    except BaseException as e:  # noqa: B036 - Hypothesis raises an ExceptionGroup for several bugs
        raised = list(getattr(e, "exceptions", None) or [e])  # an ExceptionGroup holds several
        if not all(isinstance(x, SignatureFailure) for x in raised):
            raise  # not a violation: a bug in cpsim itself (or Ctrl-C)
        for x in raised:
            me.done.add(x.signature)
            me.findings[x.signature].shrunk = True
    return me.prog.examples - before


def strategy_of(cfg):
    """The scenario strategy of a ``cpsim.fuzz.FuzzConfig``."""
    return scenarios(cfg.allow_invalid, cfg.max_programs, cfg.max_tokens_per_request, space=cfg.space,
                     int32_slots=cfg.int32_slots())


def database_of(cfg):
    """The example database of a ``cpsim.fuzz.FuzzConfig`` (None without one)."""
    from hypothesis.database import DirectoryBasedExampleDatabase
    return DirectoryBasedExampleDatabase(str(Path(cfg.database) / cfg.config_key())) if cfg.database else None

"""Search the scenario space for every distinct violation, shrink each, hand them over as files.

Scenarios come from one space (``space``), valid by construction (``scenario.validate``
accepts every one of them unless ``allow_invalid`` asks for broken CP layouts), drawn by plain
random draws (``explore``, the default) or by Hypothesis; they run in the virtual world and the
coordinator judges them. Failures are
grouped by a *signature* (path, group kind, failed invariants, triggering
dimension); each signature is shrunk on its own and written as a repro file that
``cpsim replay`` (or any cpsim, on any machine) reruns.

Sizes are kept small on purpose: the Triton interpreter runs one program per
request per group per rank per path, at a few milliseconds each, so the space
spends its budget on *positions* and *cache sizes* (where the int32 / float32 /
window limits live) rather than on token counts.

The parts: ``repro`` (one evaluation, repro files), ``signature`` (which distinct bug a failure is),
``searcher`` (one job's search and shrinking), ``jobs`` (several job processes, writing the findings).
The names below load those modules when first used, so ``import cpsim.fuzz`` (the command line's
defaults) and ``cpsim.fuzz.space`` cost no torch import.
"""

from __future__ import annotations

import importlib
from pathlib import Path

DEFAULT_DB = Path(".cpsim") / "hypothesis"
DEFAULT_PATHS = ("v1", "v2")
EXPLORERS = ("random", "hypothesis")

# Public name -> the module of this package that defines it (loaded on first use: ``__getattr__``).
PUBLIC = {
    **dict.fromkeys(("REPRO_SCHEMA", "Outcome", "Repro", "evaluate", "fault_names", "knobs_for_scenario", "load_repro",
                     "profiled", "replay", "resolve_fault", "size", "size_key", "sized", "write_repro"), "repro"),
    **dict.fromkeys(("ANY_DIMENSION", "DIMENSIONS", "Dimension", "GENERIC_INVARIANTS", "components", "group_kind",
                     "Finding", "load_known", "matches", "merge_nested", "signature_invariants", "signature_parts",
                     "signature_text"), "signature"),
    **dict.fromkeys(("INT32_SPACE", "SPACES", "FuzzConfig", "FuzzResult", "Progress", "_Searcher",
                     "check_db_dir", "finish", "search", "shrink_cache", "shrink_caches"), "searcher"),
    **dict.fromkeys(("JobEnded", "JobFailed", "check_out_dir", "fuzz", "merge", "repro_of", "search_jobs", "write_findings"),
                    "jobs"),
    **dict.fromkeys(("SEED_STRIDE", "SignatureFailure", "database_of", "hypothesis_round", "scenarios",
                     "strategy_of"), "rounds"),
}


def __getattr__(name: str):
    """``cpsim.fuzz.NAME``: the public names of the parts, imported when first asked for."""
    if name not in PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{PUBLIC[name]}"), name)

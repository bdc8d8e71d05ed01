"""How much one input may make cpsim allocate: limits checked before any allocation.

A scenario or an explicit batch names sizes (requests, table widths, array shapes) that cpsim
turns into arrays. A size past what any deployment uses would otherwise be found out by the
operating system (gigabytes of RSS, then a ``MemoryError`` traceback or the OOM killer); these
limits refuse it first, exit 2 with one line naming the field and the limit
(docs/SCENARIO_FILES.md, "Size limits", says them for users). Each limit is far above a real
step: a 1024-request step of a 128K-token model with 16-token blocks has 8M table entries per
group on one rank; a 1M-token capture has 1M positions.
"""

from __future__ import annotations

from cpsim.errors import ConfigError
from cpsim.layout import table_width

MAX_ARRAY_ENTRIES = 1 << 26      # entries of any one array of an explicit batch or capture (512 MiB as int64)
MAX_BATCH_ENTRIES = 1 << 27      # entries of all the arrays of one explicit batch together (1 GiB as int64)
MAX_JSON_ENTRIES = 1 << 20       # entries of the inline arrays of a one-file JSON batch (bigger ones: .npz)
MAX_RANK_TABLE_ENTRIES = 1 << 26  # a scenario's block-table entries on one rank, every group's tables together
MAX_RANK_SLOT_ENTRIES = 1 << 26   # a scenario's slot-buffer entries on one rank: groups x slot buffer


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def array_fits(field: str, what: str, shape: tuple[int, ...]) -> int:
    """The entries of ``what`` (an array, named) of the declared ``shape``; ConfigError past ``MAX_ARRAY_ENTRIES``."""
    n = _size(shape)
    if n > MAX_ARRAY_ENTRIES:
        raise ConfigError(field, f"{what} declares shape {tuple(shape)} = {n} entries, more than the "
                                 f"limit of {MAX_ARRAY_ENTRIES} entries per array (docs/SCENARIO_FILES.md)")
    return n


def batch_fits(field: str, total: int, limit: int = MAX_BATCH_ENTRIES, what: str = "the batch's arrays") -> None:
    """All the arrays of one batch together (``total`` entries) stay within ``limit``."""
    if total > limit:
        raise ConfigError(field, f"{what} hold {total} entries together, more than the limit of {limit} "
                                 f"(docs/SCENARIO_FILES.md)")


def scenario_fits(s):
    """``s`` when its per-rank allocation (block tables, slot buffers) stays within the limits.

    Tables: every group has ``max_num_reqs`` rows of ``cdiv(max_model_len, B x g)`` blocks, times
    the kernel blocks per block. Slot buffers: one row per group of the slot buffer's length."""
    lim = s.limits
    tables = sum(lim.max_num_reqs * table_width(lim.max_model_len, g.block_size, g.world(s.cp)) * g.bpk
                 for g in s.groups)
    if tables > MAX_RANK_TABLE_ENTRIES:
        raise ConfigError("limits.max_num_reqs", f"{len(s.groups)} group(s) x {lim.max_num_reqs} requests x their "
                                                 f"table widths for max_model_len {lim.max_model_len} = {tables} "
                                                 f"block-table entries per rank, more than the limit of "
                                                 f"{MAX_RANK_TABLE_ENTRIES} (docs/SCENARIO_FILES.md)")
    slots = len(s.groups) * lim.slot_buffer_size
    if slots > MAX_RANK_SLOT_ENTRIES:
        raise ConfigError("limits.max_num_batched_tokens", f"{len(s.groups)} group(s) x a slot buffer of "
                                                           f"{lim.slot_buffer_size} entries = {slots} slot entries per "
                                                           f"rank, more than the limit of {MAX_RANK_SLOT_ENTRIES} "
                                                           f"(docs/SCENARIO_FILES.md)")
    return s

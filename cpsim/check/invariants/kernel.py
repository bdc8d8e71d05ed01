"""What a user's kernel did besides its slots: guard entries, its inputs, its result's type."""

from __future__ import annotations

from cpsim.check.findings import MAX_EXAMPLES, Example, Violation, flat_nonzero, rows_with_any, slot_text
from cpsim.check.invariants import Invariant
from cpsim.layout import GUARD


def guard_intact(ctx, path, g, guards: np.ndarray, entries: int) -> list[Violation]:
    """The guard entries framing each output row (gathered as [ranks, 2 * width]) still hold GUARD."""
    width = guards.shape[1] // 2
    broken = guards != GUARD
    out = []
    for r in rows_with_any(broken):
        bad = flat_nonzero(broken[r]).tolist()
        index = [c - width if c < width else entries + c - width for c in bad]
        out.append(Violation("guard-intact", path, g.name, len(bad),
                             f"rank {r}: {len(bad)} guard entr(ies) around the slot buffer overwritten: the kernel "
                             f"wrote outside [0, {entries}) (max_num_tokens {entries}); first at index {index[0]}",
                             [r], [Example(r, None, None, f"untouched guard at index {i}", slot_text(int(guards[r, c])))
                                   for i, c in list(zip(index, bad))[:MAX_EXAMPLES]]))
    return out


# The columns of a gathered ``written`` array (``cpsim.paths._intact.INPUTS``; the oracle keeps its own copy).
INPUT_NAMES = ("positions", "query_start_loc", "idx_mapping", "block table")


def inputs_intact(ctx, path, g, written: np.ndarray) -> list[Violation]:
    """The kernel left every input it was handed as it was (``written`` [ranks, inputs]: entries changed)."""
    out = []
    for r in rows_with_any(written > 0):
        for col in flat_nonzero(written[r] > 0).tolist():
            n = int(written[r, col])
            name = INPUT_NAMES[col]
            what = f"group {g.name}'s block table" if name == "block table" else name
            out.append(Violation("inputs-intact", path, g.name, n,
                                 f"kernel wrote {n} entr{'y' if n == 1 else 'ies'} of {what} on rank {r} (inputs "
                                 f"are the kernel's to read: a runtime keeps them for the next step)", [r]))
    return out


# A callable's result's faults by code (``cpsim.paths.adapters.OUTPUT_FAULTS``, same order).
OUTPUT_FAULTS = ("", "not a tensor", "not 1-D", "floating-point", "complex", "bool", "on another device",
                 "shorter than the scheduled tokens", "longer than the slot buffer")


def kernel_output(ctx, path, g, faults: np.ndarray) -> list[Violation]:
    """The callable returned a 1-D integer tensor of slots on the device (``faults`` [ranks] codes)."""
    out = []
    for r in flat_nonzero(faults > 0).tolist():
        code = int(faults[r])
        what = OUTPUT_FAULTS[code] if code < len(OUTPUT_FAULTS) else f"fault {code}"
        out.append(Violation("kernel-output", path, g.name, 1,
                             f"kernel returned a result that is {what} for group {g.name} on rank {r}; the callable "
                             f"ABI returns a 1-D integer tensor of slots on the kernel's device", [r]))
    return out


def completed(case) -> list[Violation]:
    """A path with a case ran on every rank: one whose kernel did not complete has no slots, and its
    verdicts are ``coordinator.kernel_failed``'s."""
    return []


KERNEL_COMPLETES = Invariant("kernel-completes", "path", completed, count=lambda c: c.ranks)
GUARD_INTACT = Invariant("guard-intact", "group", lambda c: guard_intact(c.ctx, c.path, c.g, c.guards, c.entries),
                         lambda c: c.guards is not None, lambda c: c.guards.size)
# -1: a rank ran cpsim's own kernels, which have no inputs to keep.
INPUTS_INTACT = Invariant("inputs-intact", "group", lambda c: inputs_intact(c.ctx, c.path, c.g, c.written),
                          lambda c: c.written is not None and (c.written >= 0).all(), lambda c: c.written.size)
KERNEL_OUTPUT = Invariant("kernel-output", "group", lambda c: kernel_output(c.ctx, c.path, c.g, c.faults),
                          lambda c: c.faults is not None and c.g.slot_mapped, lambda c: c.faults.shape[0])

"""What an explicit batch's positions reach: below ``max_model_len``, and inside each table row read.

A hand-written or edited batch whose positions run past ``limits.max_model_len``, or past the
width of the table row a rank's kernel reads for them, is not a step any host hands a kernel: no
kernel can map it right, so judging it would blame the kernel for the file. It is refused as
input (exit 2) naming the rank, group, request and position.

A batch that records a real run is judged instead: a capture (every step of a ``.cpcap``) or a
batch written from one (``--shrink``) names the kernels whose outputs it holds in
``label.kernels`` and gives those outputs. Its host did hand that table or those positions to the
kernel, so what the kernel made of them is the finding (``block-sizing``, ``dense-local``,
``row-bounds``), and a note on the step says so.
"""

from __future__ import annotations

import numpy as np

from cpsim.check.explicit_batch import ExplicitStep, RankBatch
from cpsim.errors import ConfigError
from cpsim.layout import shard_rank, table_index


def recorded(step: ExplicitStep) -> str | None:
    """The kernels whose outputs the step records from a real run (``label.kernels`` with outputs given)."""
    kernels = step.label.get("kernels")
    if not kernels or not step.has_outputs:
        return None
    return ", ".join(str(k) for k in kernels) if isinstance(kernels, list) else str(kernels)


def check(step: ExplicitStep) -> None:
    """Refuse positions past ``max_model_len`` or past a table row's width (ConfigError naming the
    first); a step that records a real run gets a note instead (``recorded``)."""
    problems = [p for r, rb in enumerate(step.ranks) for p in _rank_problems(step, r, rb)]
    if not problems:
        return
    run = recorded(step)
    if run is None:
        raise ConfigError(*problems[0])
    notes = step.notes
    notes.append(f"{problems[0][0]}: {problems[0][1]}; judged, not refused: the step records a real run of "
                 f"{run}, whose host handed these inputs to its kernel")
    step.label["notes"] = notes


def _tokens(rb: RankBatch, gi: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, request) of the tokens group ``gi``'s kernel maps to a slot: not a dummy request's,
    not a negative position, not one flagged ``is_padding``."""
    own = rb.own_tokens(gi)
    pos, req = own if own is not None else (rb.positions[: rb.num_scheduled], rb.token_requests())
    keep = (pos >= 0) & (rb.idx_mapping[req] >= 0) if req.size else np.zeros(0, dtype=bool)
    if own is None and rb.is_padding is not None:
        keep &= ~rb.is_padding
    return pos[keep], req[keep]


def _rank_problems(step: ExplicitStep, r: int, rb: RankBatch) -> list[tuple[str, str]]:
    mml = step.limits.max_model_len
    out = []
    for gi, (g, e, t) in enumerate(zip(step.groups, step.entry_sizes, rb.tables)):
        if t is None:
            continue
        pos, req = _tokens(rb, gi)
        if pos.size and int(pos.max()) >= mml:
            i = int(np.argmax(pos))
            out.append((f"ranks[{r}].positions" if rb.own_tokens(gi) is None else f"ranks[{r}].g{gi}({g.name}).positions",
                        f"position {int(pos[i])} of request {int(req[i])} is not below limits.max_model_len {mml}"))
        if not g.slot_mapped or g.circular or not pos.size:
            continue
        n = g.world(step.cp)
        k, _, owner = table_index(pos, g.block_size, e, n, step.cp.interleave)
        past = (k >= t.shape[1]) & ((owner == shard_rank(r, n)) if n > 1 else True)
        if past.any():
            i = int(np.argmax(past))
            out.append((f"ranks[{r}].g{gi}({g.name}).table",
                        f"width {t.shape[1]} is too narrow for position {int(pos[i])} of request {int(req[i])}: "
                        f"rank {r}'s kernel reads entry {int(k[i])} of its row for it"))
    return out

"""The coordinator's entry point for explicit batches (given positions, tables, outputs).

The invariants are the coordinator's own functions, unchanged: this module only
turns an :class:`~cpsim.check.explicit_batch.ExplicitStep` into what they read — a
scenario whose batch *returns* the given positions instead of deriving them, and
per rank and group the request's physical blocks read off the given table (the
table *is* the allocation the kernel was handed). Expected slots therefore come
from ``cpsim.layout`` applied to the given tables. Pure functions; no kernels.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from cpsim.check import coordinator
from cpsim.check.explicit_batch import ExplicitStep, RankBatch
from cpsim.check.gathered import Gathered
from cpsim.errors import ConfigError
from cpsim.layout import PAD_SLOT_ID
from cpsim.scenario import Batch, Request, Scenario


@dataclass(frozen=True)
class GivenBatch(Batch):
    """A batch whose positions and token->request map are given (any order), not ``context + arange``.

    Tokens that write nothing are padding here besides ``is_padding``: the tokens of a dummy request
    (``idx_mapping == -1``: MRV2 writes PAD for them, vLLM 0.31+) and tokens at a negative position
    (SPEC §2.4). A group may carry its own tokens (:meth:`group_tokens`)."""

    @classmethod
    def of(cls, rb: RankBatch) -> "GivenBatch":
        qsl = rb.query_start_loc
        pos = rb.positions[: rb.num_scheduled]
        starts = rb.replay_start if rb.replay_start is not None else np.zeros(rb.num_reqs, dtype=np.int64)
        reqs = tuple(Request(_first_position(pos[a:b]), int(b - a), "given", replay_start=int(st))
                     for a, b, st in zip(qsl[:-1].tolist(), qsl[1:].tolist(), starts.tolist()))
        out = cls(reqs, tuple(int(i) for i in rb.idx_mapping), int(rb.num_tokens_padded))
        token_req = rb.token_requests()
        object.__setattr__(out, "_given_positions", np.ascontiguousarray(pos, dtype=np.int64))
        object.__setattr__(out, "_given_requests", token_req)
        object.__setattr__(out, "_given_dead", _writes_nothing(pos, token_req, rb.idx_mapping))
        own = {}
        for gi in range(len(rb.tables)):
            t = rb.own_tokens(gi)
            if t is not None:
                gp, gr = (np.ascontiguousarray(a, dtype=np.int64) for a in t)
                own[gi] = (gp, gr, _writes_nothing(gp, gr, rb.idx_mapping))
        object.__setattr__(out, "_group_tokens", own)
        return out

    def positions(self) -> np.ndarray:
        return self._given_positions

    def token_request(self) -> np.ndarray:
        return self._given_requests

    def padding_mask(self) -> np.ndarray:
        return super().padding_mask() | self._given_dead

    @property
    def has_padding(self) -> bool:
        return super().has_padding or bool(self._given_dead.any())

    def group_tokens(self, gi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(positions, request of each token, writes-nothing mask) of group ``gi``'s own tokens; None: the batch's."""
        return self._group_tokens.get(gi)


def _first_position(pos: np.ndarray) -> int:
    """A request's first cached position as a scenario sees it (its smallest non-negative given position)."""
    ok = pos[pos >= 0]
    return int(ok.min()) if ok.size else 0


def _writes_nothing(pos: np.ndarray, req: np.ndarray, idx_mapping: np.ndarray) -> np.ndarray:
    """bool per token: a dummy request's token or a negative position (PAD on every rank, SPEC §2.4)."""
    dummy = idx_mapping[req] < 0 if req.size else np.zeros(0, dtype=bool)
    return dummy | (pos < 0)


class TableBlocks:
    """Stands in for an ``Allocation``: request i's physical blocks are its table row."""

    def __init__(self, blocks: torch.Tensor, live: np.ndarray | None = None):
        self.blocks_ = blocks
        if live is None:  # not given: entries up to the row's last non-zero id (a trailing 0 reads as no block)
            rows = blocks.numpy()
            nz = rows != 0
            live = np.where(nz.any(1), rows.shape[1] - np.argmax(nz[:, ::-1], 1), 0) if rows.size else \
                np.zeros(rows.shape[0], dtype=np.int64)
        self.live_ = np.asarray(live, dtype=np.int64)

    def live(self) -> np.ndarray:
        return self.live_

    def padded(self, width: int | None = None) -> torch.Tensor:
        return self.blocks_ if width is None else self.blocks_[:, :width]

    @property
    def blocks(self) -> tuple[np.ndarray, ...]:
        """Each request's live blocks, as ``Allocation.blocks`` (for pictures)."""
        return tuple(row[:n] for row, n in zip(self.blocks_.numpy(), self.live_.tolist()))


def request_blocks(step: ExplicitStep, rb: RankBatch, gi: int) -> TableBlocks:
    """[num_reqs, width] physical block ids of each request (kernel-block runs folded back)."""
    g, e, t = step.groups[gi], step.entry_sizes[gi], rb.tables[gi]
    if t is None or t.size == 0:
        return TableBlocks(torch.zeros((rb.num_reqs, 1), dtype=torch.int64))
    rows = rb.idx_mapping
    phys = t[np.clip(rows, 0, None)]
    phys[rows < 0] = 0
    per = g.block_size // e
    live = rb.live(gi)
    if live is not None:
        live = np.where(rows < 0, 0, live[np.clip(rows, 0, None)])
        live = -(-live // per)  # kernel-block entries -> physical blocks
    if per > 1:
        phys = phys[:, ::per] // per
    return TableBlocks(torch.from_numpy(np.ascontiguousarray(phys, dtype=np.int64)), live)


def scenario(step: ExplicitStep) -> Scenario:
    name = step.label.get("name") or "explicit"
    return Scenario(str(name), step.cp, step.groups, step.limits, GivenBatch.of(step.ranks[0]), allow_invalid=True)


def allocations(step: ExplicitStep) -> list[list[TableBlocks]]:
    return [[request_blocks(step, rb, gi) for gi in range(len(step.groups))] for rb in step.ranks]


def gathered(step: ExplicitStep, slots: list[np.ndarray] | None = None, path: str | None = None,
             written: list[np.ndarray] | None = None) -> Gathered:
    """The all-gather of the given outputs (or of ``slots``, one [groups, entries] array per rank);
    ``written``: per rank, the [groups, inputs] input entries a user's kernel wrote (``inputs-intact``)."""
    slots = slots if slots is not None else [rb.slots for rb in step.ranks]
    if any(s is None for s in slots):
        missing = [r for r, s in enumerate(slots) if s is None]
        raise ConfigError("slots", f"rank(s) {missing} give no slot mappings; run a kernel on the inputs "
                                   f"(--kernel-{step.path} SPEC or builtin)")
    widths = {s.shape[1] for s in slots}
    if len(widths) != 1:
        raise ConfigError("slots", f"ranks give slot buffers of different lengths {sorted(widths)}")
    enabled = [[t is not None and (step.path == "v2" or g.slot_mapped) for g, t in zip(step.groups, rb.tables)]
               for rb in step.ranks]
    return Gathered(
        path or step.path,
        torch.from_numpy(np.stack([np.asarray(s, dtype=np.int64) for s in slots])),
        torch.tensor(enabled, dtype=torch.bool),
        torch.tensor([[0 if t is None else t.shape[1] for t in rb.tables] for rb in step.ranks], dtype=torch.int64),
        torch.tensor([list(step.entry_sizes)] * len(step.ranks), dtype=torch.int64),
        written=None if written is None else torch.from_numpy(np.stack([np.asarray(w, dtype=np.int64)
                                                                        for w in written])),
    )


def _without_padding(step: ExplicitStep, runs: dict | None):
    """The step with its ``is_padding`` tokens taken out of the scheduled range (and their outputs aside).

    Flagged tokens are not scheduled tokens of any rank: every invariant runs on the
    rest; the flagged entries are checked to be PAD on their own. Buffers keep their
    length (PAD appended), so ``capacity`` sees what the kernel had.
    """
    pad = step.ranks[0].is_padding
    keep = np.nonzero(~pad)[0]
    flagged = np.nonzero(pad)[0]

    def move(slots):
        if slots is None:
            return None, None
        n = step.ranks[0].num_scheduled
        tail = np.full((slots.shape[0], len(flagged)), PAD_SLOT_ID, dtype=slots.dtype)
        return (np.concatenate([slots[:, keep[keep < slots.shape[1]]], slots[:, n:], tail], axis=1),
                slots[:, flagged[flagged < slots.shape[1]]])

    ranks, aside = [], {}
    for r, rb in enumerate(step.ranks):
        counts = np.bincount(np.repeat(np.arange(rb.num_reqs), np.diff(rb.query_start_loc))[keep],
                             minlength=rb.num_reqs)
        n = rb.num_scheduled
        kept, out = move(rb.slots)
        aside.setdefault(step.path, []).append(out)
        ranks.append(RankBatch(np.concatenate([rb.positions[keep], rb.positions[n:]]),
                               np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), rb.idx_mapping,
                               rb.num_tokens_padded - len(flagged), rb.tables, kept, num_blocks=rb.num_blocks,
                               replay_start=rb.replay_start))
    new_runs = {}
    for name, per_rank in (runs or {}).items():
        moved = [move(x) for x in per_rank]
        new_runs[name] = [m[0] for m in moved]
        aside[name] = [m[1] for m in moved]
    return dataclasses.replace(step, ranks=ranks), new_runs, aside, flagged


def _flagged_verdicts(step: ExplicitStep, verdicts, aside: dict, flagged: np.ndarray, gath: dict) -> None:
    """``padding`` also fails where a token flagged ``is_padding`` got a slot."""
    rb = step.ranks[0]
    req = np.repeat(np.arange(rb.num_reqs), np.diff(rb.query_start_loc))
    for name, per_rank in aside.items():
        path = name if name in gath else ("captured" if "captured" in gath else step.path)
        if path not in gath or any(x is None for x in per_rank):
            continue
        verdict = next(v for v in verdicts if v.invariant == "padding" and v.path == path)
        verdict.checked += sum(x.size for x in per_rank)
        for gi, g in enumerate(step.groups):
            if not bool(gath[path].enabled[:, gi].any()):
                continue
            bad = [(r, int(t)) for r, x in enumerate(per_rank) for t in np.nonzero(x[gi] != PAD_SLOT_ID)[0]]
            if not bad:
                continue
            examples = [coordinator.Example(r, int(req[flagged[t]]), int(rb.positions[flagged[t]]), "PAD (is_padding)",
                                            str(int(per_rank[r][gi, t]))) for r, t in bad[: coordinator.MAX_EXAMPLES]]
            verdict.violations.append(coordinator.Violation(
                "padding", path, g.name, len(bad), f"{len(bad)} token(s) flagged is_padding hold a slot",
                sorted({r for r, _ in bad}), examples))
            verdict.status = "fail"


def check(step: ExplicitStep, runs: dict[str, list[np.ndarray]] | None = None, profile=None,
          written: dict[str, list[np.ndarray]] | None = None
          ) -> tuple[Scenario, dict[str, Gathered], list[coordinator.Verdict]]:
    """Every applicable invariant on the given outputs and on each extra run (``{name: per-rank slots}``);
    ``written``: ``{name: per-rank [groups, inputs] counts}`` of a run whose kernel was a user's.

    ``same-scenario`` compares the ranks' batch inputs: all ranks of one step must
    have been handed the same positions, ``query_start_loc``, ``idx_mapping`` and
    ``is_padding``. Tokens flagged ``is_padding`` must be PAD everywhere.
    """
    flagged, orig = None, step
    fingerprints = [rb.fingerprint() for rb in step.ranks]
    if step.ranks[0].is_padding is not None and step.ranks[0].is_padding.any():
        step, runs, aside, flagged = _without_padding(step, runs)
    s = scenario(step)
    gath: dict[str, Gathered] = {}
    if step.has_outputs:
        gath[step.path if not runs else "captured"] = gathered(step)
    for name, slots in (runs or {}).items():
        gath[name] = gathered(step, slots, name, (written or {}).get(name))
    if not gath:
        gathered(step)  # raises: nothing to check
    verdicts = coordinator.check(s, allocations(step), gath, fingerprints, profile)
    if flagged is not None:
        _flagged_verdicts(orig, verdicts, aside, flagged, gath)
    return s, gath, verdicts

"""An explicit batch: one step's arrays per CP rank as a host handed them to its kernel (and,
when known, the slots the kernel wrote). ``cpsim.capture.batch`` reads and writes them;
``cpsim.check.explicit`` judges them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cpsim.scenario import CPConfig, KVGroup, Limits


@dataclass
class RankBatch:
    """What one CP rank's kernel launch(es) saw in one step."""

    positions: np.ndarray            # int64 [>= num_tokens_padded]; entries past query_start_loc[-1] unused
    query_start_loc: np.ndarray      # int64 [num_reqs + 1]
    idx_mapping: np.ndarray          # int64 [num_reqs]: table row of each request (-1 = dummy)
    num_tokens_padded: int
    tables: list[np.ndarray | None]  # per group; None = the group was not launched on this rank
    slots: np.ndarray | None = None  # int64 [groups, entries] as produced; None = not given
    is_padding: np.ndarray | None = None  # bool [num_scheduled]: scheduled tokens that must get PAD (rejected drafts)
    # per group: int64 [rows] live entries of each table row (vLLM's ``num_blocks``); None = read off the
    # row (entries up to its last non-zero id). Entries below it are blocks, id 0 included.
    num_blocks: list[np.ndarray | None] | None = None
    replay_start: np.ndarray | None = None  # int64 [num_reqs]: prefix-cache replay start (0 = none); None = none
    # per group: that group's own tokens, when its host derives them (vllm-ascend 0.23.0.post1
    # ``positions_compressed_list`` / ``req_indices_compressed_list``): int64 positions and the request
    # (batch index) of each token; None = the step's scheduled tokens. Group g's slot row is indexed by them.
    group_positions: list[np.ndarray | None] | None = None
    group_requests: list[np.ndarray | None] | None = None

    def live(self, gi: int) -> np.ndarray | None:
        return None if self.num_blocks is None else self.num_blocks[gi]

    def own_tokens(self, gi: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(positions, request of each token) of group ``gi`` when it has its own; None: the step's."""
        pos = None if self.group_positions is None else self.group_positions[gi]
        if pos is None:
            return None
        req = None if self.group_requests is None else self.group_requests[gi]
        return pos, req if req is not None else self.token_requests()

    def token_requests(self) -> np.ndarray:
        """int64 [scheduled]: the request (batch index) of each scheduled token."""
        return np.repeat(np.arange(self.num_reqs, dtype=np.int64), np.diff(self.query_start_loc))

    @property
    def num_reqs(self) -> int:
        return len(self.query_start_loc) - 1

    @property
    def num_scheduled(self) -> int:
        return int(self.query_start_loc[-1]) if len(self.query_start_loc) else 0

    def fingerprint(self) -> str:
        """Hash of the rank-independent inputs: every rank of one step must agree on it."""
        h = hashlib.sha256()
        pad = self.is_padding if self.is_padding is not None else np.zeros(0, dtype=bool)
        for a in (self.positions[: self.num_scheduled], self.query_start_loc, self.idx_mapping, pad):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
            h.update(b"|")
        # inputs added later enter only when given, so older batches keep their fingerprints
        extra = [("replay_start", self.replay_start)] + [
            (f"g{gi}", a) for gi in range(len(self.tables)) for a in (self.own_tokens(gi) or ())]
        for name, a in extra:
            if a is not None:
                h.update(name.encode() + np.ascontiguousarray(a, dtype=np.int64).tobytes() + b"|")
        h.update(str(self.num_tokens_padded).encode())
        return h.hexdigest()[:16]


@dataclass
class ExplicitStep:
    """One step across all CP ranks (index = total CP rank)."""

    path: str                        # "v1": logical tables, one launch per group; "v2": one launch, idx_mapping rows
    cp: CPConfig
    groups: tuple[KVGroup, ...]
    entry_sizes: tuple[int, ...]     # slots per table entry of each group (b: kernel-block ids, B: physical ids)
    limits: Limits
    ranks: list[RankBatch]
    label: dict[str, Any] = field(default_factory=dict)  # where it came from: step, call, source file, notes

    @property
    def notes(self) -> list[str]:
        """``label.notes`` as a list (a hand-written file may give one string)."""
        n = self.label.get("notes") or []
        return [n] if isinstance(n, str) else [str(x) for x in n]

    @property
    def has_outputs(self) -> bool:
        return all(r.slots is not None for r in self.ranks)

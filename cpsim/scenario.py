"""What every rank builds identically: CP config, KV-cache groups, limits, one batch.

A scenario is plain data. Ranks agree on it through its fingerprint (the hash of
the canonical JSON), so anything that changes a slot mapping must be a field here.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cpsim import bounds, layout
from cpsim.plain_data import plain as _plain
from cpsim.errors import ConfigError

GROUP_KINDS = ("attention", "sliding_window", "mamba")
SLOT_BUFFER_DTYPES = ("abi", "int32", "int64")  # "abi": the buffer the kernel's ABI names (its host's)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class CPConfig:
    dcp: int = 1
    pcp: int = 1
    interleave: int = 1

    @property
    def world(self) -> int:
        """Total CP world size N = PCP x DCP."""
        return self.dcp * self.pcp

    def total_rank(self, pcp_rank: int, dcp_rank: int) -> int:
        return pcp_rank * self.dcp + dcp_rank


@dataclass(frozen=True)
class KVGroup:
    name: str
    kind: str = "attention"
    block_size: int = 128          # physical block size B
    kernel_block_size: int = 0     # b; 0 means b = B
    cp_sharded: bool = True        # upstream `dcp_sharded`; false is cp_size 1
    num_blocks: int = 4096         # physical blocks in each rank's cache
    cp_size: int = 0               # upstream `group_cp_sizes[i]`: g | N; 1 replicated; 0 = the world size
    prefix_cacheable: bool = True  # upstream `spec.prefix_cacheable`: replayed positions are PAD here
    prefix_replay_tokens: int = 0  # upstream `spec.prefix_replay_tokens`: the replay window this group asks for
    row_blocks: int = 0            # a tail group narrower than the sequence: rows hold this many blocks; 0 = all
    compress_ratio: int = 1        # a compressed group (explicit batches): its own positions index every r-th token

    @property
    def b(self) -> int:
        return self.kernel_block_size or self.block_size

    @property
    def bpk(self) -> int:
        return self.block_size // self.b

    @property
    def circular(self) -> bool:
        return self.kind == "sliding_window"

    @property
    def slot_mapped(self) -> bool:
        """Mamba / state groups have no per-token slots."""
        return self.kind != "mamba"

    @property
    def pads_replay(self) -> bool:
        """Replayed positions get PAD in this group: it keeps its prefix-cache KV (and has slots to pad)."""
        return self.prefix_cacheable and self.slot_mapped

    def world(self, cp: CPConfig) -> int:
        """The group's CP size ``g``: ranks one copy of its KV is sharded over (1 = every rank
        holds every token). Ranks ``r`` and ``r + k*g`` are replicas of each other."""
        if not self.cp_sharded or self.kind != "attention":
            return 1
        return self.cp_size or cp.world


@dataclass(frozen=True)
class Limits:
    max_model_len: int = 8192
    max_num_reqs: int = 16
    max_num_batched_tokens: int = 2048
    num_speculative_tokens: int = 0
    slot_buffer_dtype: str = "abi"  # the host's slot buffer handed a kernel under test (Triton casts its stores)

    @property
    def slot_buffer_size(self) -> int:
        """Slot-mapping entries: scheduled tokens plus the MTP draft slots."""
        return self.max_num_batched_tokens + max(self.num_speculative_tokens - 1, 0) * self.max_num_reqs


@dataclass(frozen=True)
class Request:
    context_len: int               # tokens already in the KV cache
    num_tokens: int                # tokens scheduled this step
    kind: str = ""                 # label only: prefill, chunked, decode, spec, dummy
    padded_drafts: int = 0         # the last n scheduled tokens are padding (rejected / excess drafts)
    replay_start: int = 0          # prefix-cache replay: positions [replay_start, + window) re-run; 0 = none

    @property
    def seq_len(self) -> int:
        return self.context_len + self.num_tokens


@dataclass(frozen=True)
class Batch:
    requests: tuple[Request, ...]
    idx_mapping: tuple[int, ...] = ()   # v2 table row per batch index; -1 = dummy; () = identity
    num_tokens_padded: int = 0          # graph padding; 0 = no padding
    is_padding: tuple[int, ...] = ()    # scheduled token indices that are padding (get PAD)

    @property
    def num_reqs(self) -> int:
        return len(self.requests)

    # The per-token arrays below are derived once per batch (a frozen dataclass, so they cannot go
    # stale) and handed out as copies: the fuzz loop asks for them dozens of times per scenario.

    def padding_mask(self) -> np.ndarray:
        """bool [num_tokens]: tokens flagged padding (``is_padding``, a request's padded drafts, every token
        of a dummy request: idx_mapping -1, a graph-padding row, SPEC §2.4)."""
        return self._padding_mask.copy()

    @functools.cached_property
    def _padding_mask(self) -> np.ndarray:
        mask = np.zeros(self.num_tokens, dtype=bool)
        qsl = self.query_start_loc()
        for i, r in enumerate(self.requests):
            dead = r.num_tokens if self.is_dummy(i) else r.padded_drafts
            mask[int(qsl[i + 1]) - dead: int(qsl[i + 1])] = True
        idx = [t for t in self.is_padding if 0 <= t < self.num_tokens]
        mask[idx] = True
        return mask

    def is_dummy(self, i: int) -> bool:
        """Request ``i`` has no table row (v2 ``idx_mapping`` -1): a dummy or graph-padding request."""
        return bool(self.idx_mapping) and self.idx_mapping[i] < 0

    @property
    def has_padding(self) -> bool:
        return bool(self.is_padding) or any(r.padded_drafts or (r.num_tokens and self.is_dummy(i))
                                            for i, r in enumerate(self.requests))

    def allocated_lens(self) -> list[int]:
        """Positions each request holds blocks for: up to its last token that is not padding
        (the scheduler allocates for the tokens it keeps; padding past them has no block); none for a dummy."""
        return list(self._allocated_lens)

    @functools.cached_property
    def _allocated_lens(self) -> tuple[int, ...]:
        mask = self.padding_mask()  # the method: a given batch (``check.explicit``) adds its own padding
        qsl = self.query_start_loc()
        out = []
        for i, r in enumerate(self.requests):
            real = np.flatnonzero(~mask[int(qsl[i]): int(qsl[i + 1])])
            out.append(0 if self.is_dummy(i) else r.context_len + (int(real[-1]) + 1 if len(real) else 0))
        return tuple(out)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)

    def rows_v2(self) -> tuple[int, ...]:
        return self.idx_mapping or tuple(range(self.num_reqs))

    def query_start_loc(self) -> np.ndarray:
        return self._query_start_loc.copy()

    @functools.cached_property
    def _query_start_loc(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([r.num_tokens for r in self.requests], dtype=np.int64)]).astype(np.int64)

    def positions(self) -> np.ndarray:
        return self._positions.copy()

    @functools.cached_property
    def _positions(self) -> np.ndarray:
        parts = [np.arange(r.context_len, r.seq_len, dtype=np.int64) for r in self.requests]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def token_request(self) -> np.ndarray:
        return self._token_request.copy()

    @functools.cached_property
    def _token_request(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_reqs, dtype=np.int64), [r.num_tokens for r in self.requests])

    @property
    def has_replay(self) -> bool:
        return any(r.replay_start for r in self.requests)

    def replay_mask(self, window: int) -> np.ndarray:
        """bool [num_tokens]: scheduled tokens at a replayed position ``[replay_start, replay_start + window)``
        of their request (upstream compares the token's position, so CP does not enter here)."""
        start = np.array([r.replay_start for r in self.requests], dtype=np.int64)[self.token_request()]
        pos = self.positions()
        return (start > 0) & (pos >= start) & (pos < start + window)


@dataclass(frozen=True)
class Scenario:
    name: str
    cp: CPConfig
    groups: tuple[KVGroup, ...]
    limits: Limits
    batch: Batch
    seed: int = 0
    allow_invalid: bool = False

    # ---- serialisation -------------------------------------------------
    @property
    def replay_window(self) -> int:
        """Positions a replay re-runs: the largest window a group asks for (upstream takes the max too)."""
        return max((g.prefix_replay_tokens for g in self.groups), default=0)

    def replay_mask(self) -> np.ndarray:
        """bool [num_tokens]: scheduled tokens at replayed positions (PAD in the prefix-cacheable groups)."""
        return self._replay_mask.copy()

    @functools.cached_property
    def _replay_mask(self) -> np.ndarray:
        return self.batch.replay_mask(self.replay_window)

    def to_dict(self) -> dict[str, Any]:
        """Fields added later are left out at their defaults, so fingerprints of older
        scenarios (and repro files) stay the same."""
        d = _plain(self)
        for g in d["groups"]:
            if not g["cp_size"]:
                del g["cp_size"]
            if g["prefix_cacheable"]:
                del g["prefix_cacheable"]
            for key in ("prefix_replay_tokens", "row_blocks"):
                if not g[key]:
                    del g[key]
            if g["compress_ratio"] == 1:
                del g["compress_ratio"]
        for r in d["batch"]["requests"]:
            if not r["padded_drafts"]:
                del r["padded_drafts"]
            if not r["replay_start"]:
                del r["replay_start"]
        if not d["batch"]["is_padding"]:
            del d["batch"]["is_padding"]
        if d["limits"]["slot_buffer_dtype"] == "abi":
            del d["limits"]["slot_buffer_dtype"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str | None = None) -> "Scenario":
        """``source``: the file ``d`` was read from, named by a refusal."""
        # Imported here: building the pydantic models takes a second, and processes that only
        # unpickle scenarios (kernel workers) never need them.
        from cpsim.parsing import scenario_data
        d = scenario_data(d, source)  # unknown keys, loose types and unbounded sizes are refused here
        try:
            batch = d.get("batch", {})
            return cls(
                name=str(d.get("name", "custom")),
                cp=CPConfig(**d.get("cp", {})),
                groups=tuple(_group(i, g) for i, g in enumerate(d["groups"])),
                limits=Limits(**d.get("limits", {})),
                batch=Batch(
                    requests=tuple(Request(**r) for r in batch.get("requests", [])),
                    idx_mapping=tuple(batch.get("idx_mapping", ())),
                    num_tokens_padded=int(batch.get("num_tokens_padded", 0)),
                    is_padding=tuple(batch.get("is_padding", ())),
                ),
                seed=int(d.get("seed", 0)),
                allow_invalid=bool(d.get("allow_invalid", False)),
            )
        except KeyError as e:
            raise ConfigError(f"scenario.{e.args[0]}", "is required") from None
        except TypeError as e:
            raise ConfigError("scenario", f"unexpected or missing field ({e})") from None

    def canonical_json(self) -> str:
        return self._canonical_json

    @functools.cached_property
    def _canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def fingerprint(self) -> str:
        return self._fingerprint

    @functools.cached_property
    def _fingerprint(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]

    def replace(self, **changes) -> "Scenario":
        return dataclasses.replace(self, **changes)

    def dump(self, path: str | Path) -> None:
        path = Path(path)
        if path.suffix == ".toml":
            import tomli_w
            path.write_text(tomli_w.dumps(self.to_dict()))
        else:
            path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")


# The dataclasses a scenario is made of (a plain-data message holding one names them: cpsim.run.plain).
DATA_CLASSES = (Scenario, CPConfig, KVGroup, Limits, Request, Batch)


def _group(i: int, g: dict[str, Any]) -> KVGroup:
    """A group from JSON/TOML: ``cp_sharded`` is the older spelling of ``cp_size`` (true = the
    world size, false = 1); both may be given only when they agree."""
    if "cp_size" in g and "cp_sharded" in g and not g["cp_sharded"] and g["cp_size"] not in (0, 1):
        raise ConfigError(f"groups[{i}].cp_size", f"cp_size {g['cp_size']} contradicts cp_sharded = false "
                                                  f"(an alias of cp_size 1); give one of them")
    return KVGroup(**g)


# ---- validation --------------------------------------------------------

def _positive(field_name: str, value: int, minimum: int = 1) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ConfigError(field_name, f"must be an integer >= {minimum}, got {value!r}")


def cp_layout_error(cp: CPConfig, group: KVGroup) -> str | None:
    """Why this group's CP layout breaks the global rule, or None if it holds."""
    if group.world(cp) == 1:
        return None
    if group.block_size % cp.interleave:
        return (f"interleave {cp.interleave} must divide physical block size "
                f"{group.block_size} (group {group.name!r})")
    return None


def validate(s: Scenario) -> Scenario:
    """Raise ConfigError naming the field and the rule; return the scenario if fine."""
    _positive("cp.dcp", s.cp.dcp)
    _positive("cp.pcp", s.cp.pcp)
    _positive("cp.interleave", s.cp.interleave)
    lim = s.limits
    _positive("limits.max_model_len", lim.max_model_len)
    _positive("limits.max_num_reqs", lim.max_num_reqs)
    _positive("limits.max_num_batched_tokens", lim.max_num_batched_tokens)
    _positive("limits.num_speculative_tokens", lim.num_speculative_tokens, 0)
    if lim.slot_buffer_dtype not in SLOT_BUFFER_DTYPES:
        raise ConfigError("limits.slot_buffer_dtype", f"must be one of {', '.join(SLOT_BUFFER_DTYPES)}, "
                                                      f"got {lim.slot_buffer_dtype!r}")
    if not s.groups:
        raise ConfigError("groups", "at least one KV-cache group is required")
    names = [g.name for g in s.groups]
    if len(set(names)) != len(names):
        raise ConfigError("groups", f"group names must be unique, got {names}")
    for i, g in enumerate(s.groups):
        f = f"groups[{i}]({g.name})"
        if g.kind not in GROUP_KINDS:
            raise ConfigError(f"{f}.kind", f"must be one of {', '.join(GROUP_KINDS)}, got {g.kind!r}")
        _positive(f"{f}.block_size", g.block_size)
        _positive(f"{f}.kernel_block_size", g.kernel_block_size, 0)
        _positive(f"{f}.num_blocks", g.num_blocks, 2)
        if g.num_blocks * g.bpk > INT32_MAX:
            raise ConfigError(f"{f}.num_blocks", f"{g.num_blocks} blocks x {g.bpk} kernel blocks each must fit "
                              f"the int32 block table (<= {INT32_MAX})")
        if g.block_size % g.b:
            raise ConfigError(f"{f}.kernel_block_size",
                              f"kernel block size {g.b} must divide physical block size {g.block_size}")
        _positive(f"{f}.cp_size", g.cp_size, 0)
        if g.cp_size and s.cp.world % g.cp_size:
            raise ConfigError(f"{f}.cp_size", f"group CP size {g.cp_size} must divide the CP world size "
                                              f"{s.cp.world} (dcp x pcp)")
        if g.cp_size > 1 and g.kind != "attention":
            raise ConfigError(f"{f}.cp_size", f"only attention groups can be CP-sharded; a {g.kind} group "
                                              f"has cp_size 1, got {g.cp_size}")
        if g.circular and g.cp_sharded and g.cp_size != 1 and s.cp.world > 1:
            raise ConfigError(f"{f}.cp_sharded", f"a sliding_window (circular) group cannot be CP-sharded "
                              f"with CP world size {s.cp.world} > 1; set cp_sharded = false")
        _positive(f"{f}.prefix_replay_tokens", g.prefix_replay_tokens, 0)
        if g.prefix_replay_tokens and not g.slot_mapped:
            raise ConfigError(f"{f}.prefix_replay_tokens", f"a {g.kind} group has no slot mapping to rebuild; "
                                                           f"only attention and sliding_window groups replay")
        if g.prefix_replay_tokens and g.prefix_cacheable:
            raise ConfigError(f"{f}.prefix_cacheable", "a group with a replay window is rebuilt by the replay, so "
                                                       "it is not prefix-cacheable (upstream derives one from the "
                                                       "other); set prefix_cacheable = false")
        _positive(f"{f}.row_blocks", g.row_blocks, 0)
        if g.row_blocks and (g.kind != "attention" or g.world(s.cp) > 1):
            raise ConfigError(f"{f}.row_blocks", "a tail group narrower than the sequence is an unsharded attention "
                                                 "group (cp_size 1): every rank keeps the whole tail (SPEC §2.4)")
        if g.compress_ratio != 1:
            raise ConfigError(f"{f}.compress_ratio", "a compressed group maps its own positions, which only an "
                                                     "explicit batch gives (g<G>/positions, docs/CAPTURE.md)")
        err = cp_layout_error(s.cp, g)
        if err and not s.allow_invalid:
            raise ConfigError("cp.interleave", err + " (use --allow-invalid to run it on purpose)")

    b = s.batch
    if b.num_reqs > lim.max_num_reqs:
        raise ConfigError("batch.requests", f"{b.num_reqs} requests exceed limits.max_num_reqs {lim.max_num_reqs}")
    for i, r in enumerate(b.requests):
        _positive(f"batch.requests[{i}].context_len", r.context_len, 0)
        _positive(f"batch.requests[{i}].num_tokens", r.num_tokens, 0)
        _positive(f"batch.requests[{i}].padded_drafts", r.padded_drafts, 0)
        if r.padded_drafts > r.num_tokens:
            raise ConfigError(f"batch.requests[{i}].padded_drafts", f"{r.padded_drafts} padded drafts exceed the "
                                                                    f"request's {r.num_tokens} scheduled tokens")
        if r.seq_len > lim.max_model_len:
            raise ConfigError(f"batch.requests[{i}]", f"context_len + num_tokens = {r.seq_len} exceeds "
                              f"limits.max_model_len {lim.max_model_len}")
        _replay_rule(s, i, r)
    cap = lim.slot_buffer_size
    if b.num_tokens > cap:
        raise ConfigError("batch.requests", f"{b.num_tokens} scheduled tokens exceed the slot buffer "
                          f"({lim.max_num_batched_tokens} batched + draft slots = {cap})")
    if b.num_tokens_padded and not (b.num_tokens <= b.num_tokens_padded <= cap):
        raise ConfigError("batch.num_tokens_padded", f"{b.num_tokens_padded} must lie in "
                          f"[{b.num_tokens}, {cap}] (scheduled tokens .. slot buffer size)")
    if b.is_padding:
        bad = [t for t in b.is_padding if isinstance(t, bool) or not isinstance(t, (int, np.integer))
               or not 0 <= t < b.num_tokens]
        if bad or len(set(b.is_padding)) != len(b.is_padding):
            raise ConfigError("batch.is_padding", f"must be distinct scheduled token indices in [0, {b.num_tokens}), "
                                                  f"got {list(b.is_padding)}")
    if b.idx_mapping:
        if len(b.idx_mapping) != b.num_reqs:
            raise ConfigError("batch.idx_mapping", f"has {len(b.idx_mapping)} entries for {b.num_reqs} requests")
        rows = [x for x in b.idx_mapping if x != -1]
        if len(set(rows)) != len(rows) or any(not 0 <= x < lim.max_num_reqs for x in rows):
            raise ConfigError("batch.idx_mapping", f"rows must be distinct in [0, {lim.max_num_reqs}) or -1, "
                              f"got {list(b.idx_mapping)}")
    for i, g in enumerate(s.groups):
        need = max_blocks_needed(s, g)
        if need > g.num_blocks - 1:
            raise ConfigError(f"groups[{i}]({g.name}).num_blocks", f"{g.num_blocks} too small: a rank needs "
                              f"{need} blocks and block 0 is reserved")
    return bounds.scenario_fits(s)


def _replay_rule(s: Scenario, i: int, r: Request) -> None:
    """A replay start is upstream's ``replay_start`` of a prefill after a prefix hit: the scheduler
    rewinds the computed tokens to it and clears it once they pass ``replay_start + window``, so a
    chunk that carries one starts inside the replayed range."""
    f = f"batch.requests[{i}].replay_start"
    _positive(f, r.replay_start, 0)
    if not r.replay_start:
        return
    w = s.replay_window
    if not w:
        raise ConfigError(f, "a replay start needs a replay window: no group declares prefix_replay_tokens")
    if not r.replay_start <= r.context_len < r.replay_start + w:
        raise ConfigError(f, f"the scheduled chunk must start inside the replayed range [{r.replay_start}, "
                             f"{r.replay_start + w}) (replay_start + window {w}), but context_len is {r.context_len}")
    if r.padded_drafts or s.batch.is_dummy(i):
        raise ConfigError(f, "a request that replays is a prefill with a table row; padded_drafts belong to "
                             "spec-decode steps, and a dummy request (idx_mapping -1) has no row")


def max_blocks_needed(s: Scenario, g: KVGroup) -> int:
    """Most physical blocks any rank needs for group ``g`` across the batch."""
    n = g.world(s.cp)
    if g.circular or not g.slot_mapped:
        return sum(1 for r in s.batch.requests if r.seq_len > 0)
    cap = g.row_blocks or INT32_MAX
    return max(sum(min(layout.blocks_touched(r.seq_len, rank, g.block_size, n, s.cp.interleave), cap)
                   for r in s.batch.requests) for rank in range(n))

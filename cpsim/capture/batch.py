"""Explicit batches: one step's real kernel inputs (and outputs) for every CP rank.

A generated scenario derives positions (``context + arange``) and tables (the
allocator) itself; an explicit batch *gives* them, as a serving process saw them:
per rank the positions (any order), ``query_start_loc``, ``idx_mapping``, the
padded token count, per group the table the kernel read, and optionally the
slot mappings it produced. Replays of captures, shrunk repros and hand-written
examples all become one :class:`ExplicitStep`, so one checker serves them all.

On disk (``.npz``-compatible zip, see :mod:`cpsim.capture.archive`)::

    meta.json                  format, path, cp, groups (+ entry_size), limits, per-rank scalars
    [r{R}/]positions.npy       int64; a top-level array is shared by every rank
    [r{R}/]query_start_loc.npy
    [r{R}/]idx_mapping.npy
    r{R}/g{G}/table.npy        int32/int64 [rows, width]; absent: the group was not launched
    r{R}/g{G}/num_blocks.npy   optional int [rows]: live entries of each row (vLLM's num_blocks); entries
                               below it are blocks, id 0 included; absent: up to the row's last non-zero id
    r{R}/slots.npy             [groups, entries]; absent: no outputs given (a kernel must run)
    [r{R}/]is_padding.npy      optional bool [scheduled tokens]: tokens that must get PAD (rejected drafts)
    [r{R}/]replay_start.npy    optional int [num_reqs]: prefix-cache replay start of each request (0 = none)
    [r{R}/]g{G}/positions.npy  optional int: group G's own tokens (an indexer / compressed group), its slot
    [r{R}/]g{G}/req_indices.npy  row indexed by them; req_indices = the request of each (default: the step's)

The same content may be written as one JSON file with the arrays inline
(``"arrays": {name: list}``): handy for small hand-written examples.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from cpsim import bounds, schema
from cpsim.capture import reach
from cpsim.capture.archive import ArchiveReader, ArchiveWriter
from cpsim.check.explicit_batch import ExplicitStep, RankBatch
from cpsim.errors import ConfigError
from cpsim.parsing import parse, parse_list
from cpsim.validate import read_data
from cpsim.scenario import CPConfig, KVGroup, Limits

FORMAT = schema.EXPLICIT_FORMAT
VERSION = 1
PATHS = ("v1", "v2")


# ---- validation ---------------------------------------------------------------

def _int_array(value: Any, name: str, ndim: int, flags: bool = False, source: str | None = None) -> np.ndarray:
    """An integer array of ``ndim`` dimensions as int64 (bool only for ``flags``: is_padding)."""
    if source is not None:
        try:
            return _int_array(value, name, ndim, flags)
        except ConfigError as e:
            raise ConfigError(e.field, f"{e.rule} (in {source})") from None
    a = np.asarray(value)
    if a.ndim != ndim:
        raise ConfigError(name, f"must be a {ndim}-D {'flag' if flags else 'integer'} array, got shape {a.shape}")
    if a.dtype == bool:
        if not flags:
            raise ConfigError(name, "must hold integers, got booleans")
        a = a.astype(np.int64)
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ConfigError(name, f"must hold integers, got dtype {a.dtype}")
    if flags and a.size and (a.min() < 0 or a.max() > 1):
        raise ConfigError(name, f"flags must be 0/1 (or booleans), got {int(a.max()) if a.max() > 1 else int(a.min())}")
    return a.astype(np.int64, copy=False)


def validate(step: ExplicitStep) -> ExplicitStep:
    """Shapes, ranks and ids; raises ConfigError (exit 2) naming the field and the rule."""
    if step.path not in PATHS:
        raise ConfigError("path", f"must be one of {', '.join(PATHS)}, got {step.path!r}")
    if not step.groups:
        raise ConfigError("groups", "at least one group is required")
    if len(step.entry_sizes) != len(step.groups):
        raise ConfigError("groups", "every group needs an entry_size")
    for g, e in zip(step.groups, step.entry_sizes):
        if e not in (g.b, g.block_size):
            raise ConfigError(f"groups.{g.name}.entry_size",
                              f"{e} must be the kernel block size {g.b} or the block size {g.block_size}")
    world = step.cp.world
    if len(step.ranks) != world:
        have = len(step.ranks)
        raise ConfigError("ranks", f"CP world is {world} (DCP {step.cp.dcp} x PCP {step.cp.pcp}) but "
                                   f"{have} rank(s) were given" + (f"; missing rank(s) {list(range(have, world))}"
                                                                   if have < world else ""))
    G = len(step.groups)
    for r, rb in enumerate(step.ranks):
        where = f"ranks[{r}]"
        qsl = rb.query_start_loc
        if qsl.ndim != 1 or len(qsl) < 1:
            raise ConfigError(f"{where}.query_start_loc", "must be 1-D with num_reqs + 1 entries")
        if qsl[0] != 0 or (np.diff(qsl) < 0).any():
            raise ConfigError(f"{where}.query_start_loc", f"must start at 0 and never decrease, got "
                                                           f"{qsl[:8].tolist()}{'...' if len(qsl) > 8 else ''}")
        n = int(qsl[-1])
        if n > schema.MAX_TOKENS:
            raise ConfigError(f"{where}.query_start_loc", f"schedules {n} tokens, more than {schema.MAX_TOKENS}")
        if rb.positions.ndim != 1 or len(rb.positions) < n:
            raise ConfigError(f"{where}.positions", f"needs at least query_start_loc[-1] = {n} entries, "
                                                     f"got {rb.positions.shape}")
        _check_positions(f"{where}.positions", rb.positions[:n])
        if not n <= rb.num_tokens_padded <= len(rb.positions):
            raise ConfigError(f"{where}.num_tokens_padded", f"{rb.num_tokens_padded} must lie in "
                                                             f"[{n}, {len(rb.positions)}] (scheduled, positions)")
        if rb.idx_mapping.shape != (rb.num_reqs,):
            raise ConfigError(f"{where}.idx_mapping", f"must have num_reqs = {rb.num_reqs} entries, "
                                                       f"got shape {rb.idx_mapping.shape}")
        dummy = rb.idx_mapping < 0
        if (rb.idx_mapping < -1).any():
            raise ConfigError(f"{where}.idx_mapping", "entries are table rows or -1 (dummy request)")
        if step.path == "v1" and (np.diff(qsl)[dummy] != 0).any():
            raise ConfigError(f"{where}.idx_mapping", "a dummy request (-1) with tokens is MRV2's (path v2: its "
                                                       "tokens get PAD); on v1 it must schedule no tokens")
        if rb.is_padding is not None and rb.is_padding.shape != (n,):
            raise ConfigError(f"{where}.is_padding", f"must flag each of the {n} scheduled tokens, "
                                                      f"got shape {rb.is_padding.shape}")
        if len(rb.tables) != G:
            raise ConfigError(f"{where}.tables", f"{G} group(s) declared, {len(rb.tables)} table(s) given")
        _check_group_tokens(step, r, rb)
        _check_negative(step, r, rb)
        _check_replay(step, r, rb)
        for gi, (g, e, t) in enumerate(zip(step.groups, step.entry_sizes, rb.tables)):
            if t is None:
                continue
            tw = f"{where}.g{gi}({g.name}).table"
            if t.ndim != 2:
                raise ConfigError(tw, f"must be 2-D [rows, width], got shape {t.shape}")
            used = rb.idx_mapping[~dummy]
            if used.size and int(used.max()) >= t.shape[0]:
                raise ConfigError(tw, f"idx_mapping names row {int(used.max())} but the table has {t.shape[0]} rows")
            bpk = g.block_size // e
            limit = g.num_blocks * bpk
            live = rb.live(gi)
            if live is not None and (live.shape != (t.shape[0],) or (live < 0).any() or (live > t.shape[1]).any()):
                raise ConfigError(f"{where}.g{gi}({g.name}).num_blocks",
                                  f"must give each of the {t.shape[0]} rows a count in [0, width {t.shape[1]}], got "
                                  f"{live.tolist()[:8] if live.ndim == 1 else live.shape}")
            # entries past a row's live count are never read (stale ids, guards): only the live ones are checked
            read = np.ones(t.shape, dtype=bool) if live is None else np.arange(t.shape[1]) < live[:, None]
            ids = t[read]
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= limit):
                bad = int(ids.max()) if int(ids.max()) >= limit else int(ids.min())
                raise ConfigError(tw, f"id {bad} out of range [0, {limit}) ({g.num_blocks} blocks"
                                      f"{f' x {bpk} kernel blocks' if bpk > 1 else ''})")
            if bpk > 1 and t.shape[1] % bpk:
                raise ConfigError(tw, f"width {t.shape[1]} is not a multiple of {bpk} kernel blocks per block")
            if bpk > 1 and t.size:
                v = t.reshape(t.shape[0], -1, bpk)
                unread = ~read.reshape(t.shape[0], -1, bpk)
                ok = (v == v[:, :, :1] + np.arange(bpk)) | (v[:, :, :1] == 0) | unread
                if not ok.all():
                    raise ConfigError(tw, f"kernel-block ids must come in runs q*{bpk} .. q*{bpk}+{bpk - 1}")
                if (v[:, :, 0][~unread[:, :, 0]] % bpk).any():
                    raise ConfigError(tw, f"a run of kernel-block ids must start at a multiple of {bpk}")
        if rb.slots is not None and (rb.slots.ndim != 2 or rb.slots.shape[0] != G):
            raise ConfigError(f"{where}.slots", f"must be [groups = {G}, entries], got shape {rb.slots.shape}")
    reach.check(step)
    return step


def _check_positions(field: str, pos: np.ndarray) -> None:
    if pos.size and (int(pos.min()) < -schema.MAX_TOKENS or int(pos.max()) > schema.MAX_TOKENS):
        bad = int(pos.min()) if int(pos.min()) < -schema.MAX_TOKENS else int(pos.max())
        raise ConfigError(field, f"positions must lie in [-{schema.MAX_TOKENS}, {schema.MAX_TOKENS}] (negative: "
                                 f"the token writes nothing), got {bad}")


def _check_group_tokens(step: ExplicitStep, r: int, rb: RankBatch) -> None:
    """A group's own tokens: positions, the request of each (defaults to the step's when the counts agree)."""
    for gi, g in enumerate(step.groups):
        pos = None if rb.group_positions is None else rb.group_positions[gi]
        req = None if rb.group_requests is None else rb.group_requests[gi]
        f = f"ranks[{r}].g{gi}({g.name})"
        if pos is None and g.compress_ratio > 1:
            raise ConfigError(f"{f}.positions", f"a group with compress_ratio {g.compress_ratio} maps its own "
                                                "(compressed) positions: give them (g<G>/positions)")
        if pos is None:
            if req is not None:
                raise ConfigError(f"{f}.req_indices", "a group's request of each token needs the group's own "
                                                      "positions (g<G>/positions)")
            continue
        if rb.is_padding is not None:
            raise ConfigError(f"{f}.positions", "is_padding flags the step's tokens; a group with its own "
                                                "positions cannot be combined with it")
        if pos.ndim != 1:
            raise ConfigError(f"{f}.positions", f"must be 1-D, got shape {pos.shape}")
        _check_positions(f"{f}.positions", pos)
        if req is None and pos.size != rb.num_scheduled:
            raise ConfigError(f"{f}.req_indices", f"the group gives {pos.size} positions for the step's "
                                                  f"{rb.num_scheduled} tokens: give the request of each "
                                                  f"(g<G>/req_indices)")
        if req is not None and (req.shape != pos.shape or (req.size and (req.min() < 0 or req.max() >= rb.num_reqs))):
            raise ConfigError(f"{f}.req_indices", f"must give each of the {pos.size} tokens a request in "
                                                  f"[0, num_reqs = {rb.num_reqs}), got "
                                                  f"{req.tolist()[:8] if req.ndim == 1 else req.shape}")
        if rb.slots is not None and pos.size > rb.slots.shape[1]:
            raise ConfigError(f"{f}.positions", f"{pos.size} tokens do not fit the slot buffer of "
                                                f"{rb.slots.shape[1]} entries")


def _check_negative(step: ExplicitStep, r: int, rb: RankBatch) -> None:
    """A negative step-wide position is PAD in a ring and in a group with its own positions (an indexer /
    compressed group). No released runner hands a plain attention group one and no released kernel guards
    it (vLLM 0.33.0 and vllm-ascend 0.23.0.post1 read the table before the row), so there it is refused."""
    pos = rb.positions[: rb.num_scheduled]
    if not (pos < 0).any():
        return
    for gi, g in enumerate(step.groups):
        if rb.tables[gi] is None or not g.slot_mapped or g.circular or rb.own_tokens(gi) is not None:
            continue
        raise ConfigError(f"ranks[{r}].positions", f"position {int(pos.min())} is negative, but group {g.name} "
                                                   f"(attention) reads the step's positions: a negative position is "
                                                   f"PAD only in a sliding-window ring or a group given its own "
                                                   f"positions (g{gi}/positions); released kernels do not guard "
                                                   f"one in an attention group")


def _check_replay(step: ExplicitStep, r: int, rb: RankBatch) -> None:
    """The scenario's replay rules (SPEC §2.5) on given positions: a window, the chunk starts inside it."""
    f = f"ranks[{r}].replay_start"
    starts = rb.replay_start
    for gi, g in enumerate(step.groups):
        gf = f"groups[{gi}]({g.name}).prefix_replay_tokens"
        if g.prefix_replay_tokens and not g.slot_mapped:
            raise ConfigError(gf, f"a {g.kind} group has no slot mapping to rebuild; a replay window needs one")
        if g.prefix_replay_tokens and g.prefix_cacheable:
            raise ConfigError(gf, "a group that asks for a replay window leaves prefix caching: set "
                                  "prefix_cacheable false")
    if starts is None:
        return
    if starts.shape != (rb.num_reqs,):
        raise ConfigError(f, f"must give each of the {rb.num_reqs} requests a start, got shape {starts.shape}")
    if (starts < 0).any() or (starts > schema.MAX_TOKENS).any():
        raise ConfigError(f, f"starts must lie in [0, {schema.MAX_TOKENS}] (0 = no replay), got {starts.tolist()[:8]}")
    if not starts.any():
        return
    w = max(g.prefix_replay_tokens for g in step.groups)
    if not w:
        raise ConfigError(f, "a replay start needs a replay window: no group declares prefix_replay_tokens")
    qsl, pos = rb.query_start_loc, rb.positions
    for i in np.nonzero(starts)[0].tolist():
        st, chunk = int(starts[i]), pos[int(qsl[i]): int(qsl[i + 1])]
        if rb.idx_mapping[i] < 0:
            raise ConfigError(f"{f}[{i}]", "a dummy request (-1) has nothing to replay")
        if chunk.size and not st <= int(chunk.min()) < st + w:
            raise ConfigError(f"{f}[{i}]", f"the scheduled chunk must start inside the replayed range [{st}, "
                                           f"{st + w}) (replay_start + window {w}), but its first position is "
                                           f"{int(chunk.min())}")
        if rb.is_padding is not None and rb.is_padding[int(qsl[i]): int(qsl[i + 1])].any():
            raise ConfigError(f"{f}[{i}]", "a request that replays is a prefill; is_padding flags belong to "
                                           "spec-decode steps")


# ---- files --------------------------------------------------------------------

def _group_meta(g: KVGroup, entry_size: int) -> dict[str, Any]:
    """A group as meta.json holds it; compress_ratio left out at 1, as files before it had it."""
    d = dataclasses.asdict(g) | {"entry_size": entry_size}
    if d["compress_ratio"] == 1:
        del d["compress_ratio"]
    return d


def _meta(step: ExplicitStep) -> dict[str, Any]:
    limits = dataclasses.asdict(step.limits)
    if limits.get("slot_buffer_dtype") == "abi":  # the default, left out as Scenario.to_dict leaves it
        del limits["slot_buffer_dtype"]
    return {
        "format": FORMAT, "version": VERSION, "path": step.path,
        "cp": dataclasses.asdict(step.cp), "limits": limits,
        "groups": [_group_meta(g, e) for g, e in zip(step.groups, step.entry_sizes)],
        "ranks": [{"num_tokens_padded": int(r.num_tokens_padded)} for r in step.ranks],
        "label": step.label,
    }


def _arrays(step: ExplicitStep) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    def shared(name: str, values: list) -> None:
        if any(v is None for v in values):
            return
        if all(v.shape == values[0].shape and np.array_equal(v, values[0]) for v in values):
            out[name] = values[0]
        else:
            out.update({f"r{i}/{name}": v for i, v in enumerate(values)})
    for name in ("positions", "query_start_loc", "idx_mapping", "is_padding", "replay_start"):
        shared(name, [getattr(r, name) for r in step.ranks])
    for gi in range(len(step.groups)):
        for name, attr in (("positions", "group_positions"), ("req_indices", "group_requests")):
            shared(f"g{gi}/{name}", [None if getattr(r, attr) is None else getattr(r, attr)[gi] for r in step.ranks])
    for i, r in enumerate(step.ranks):
        for gi, t in enumerate(r.tables):
            if t is not None:
                out[f"r{i}/g{gi}/table"] = t
            if r.live(gi) is not None:
                out[f"r{i}/g{gi}/num_blocks"] = r.live(gi)
        if r.slots is not None:
            out[f"r{i}/slots"] = r.slots
    return out


def save(step: ExplicitStep, path: str | Path) -> Path:
    """``.json``: arrays inline; anything else: the zip archive."""
    path = Path(path)
    if path.suffix == ".json":
        data = _meta(step) | {"arrays": {k: v.tolist() for k, v in _arrays(step).items()}}
        path.write_text(json.dumps(data) + "\n")
        return path
    with ArchiveWriter(path) as w:
        w.json("meta", _meta(step))
        for k, v in _arrays(step).items():
            w.array(k, v)
    return path


# ---- reading: every key and value checked (cpsim.schema), one line naming the field ------------

_SHARED = ("positions", "query_start_loc", "idx_mapping", "is_padding", "replay_start")
_GROUP_SHARED = ("positions", "req_indices")  # g<G>/name: shared by every rank, or r<R>/g<G>/name
_ARRAY_NAME = re.compile(r"^r(\d+)/(?:(positions|query_start_loc|idx_mapping|is_padding|replay_start|slots)|"
                         r"g(\d+)/(?:table|num_blocks|positions|req_indices))$")
_GROUP_NAME = re.compile(r"^g(\d+)/(?:positions|req_indices)$")


def _check_names(names: list[str], world: int, groups: int, field_name: str, source: str) -> None:
    """Every array is one the format defines, for a rank and group that exist (a misspelt one would be ignored)."""
    for name in names:
        if name in _SHARED:
            continue
        gm = _GROUP_NAME.match(name)
        if gm and int(gm.group(1)) < groups:
            continue
        if gm:
            raise ConfigError(field_name, f"array {name!r} names group {gm.group(1)} but {groups} group(s) are "
                                          f"declared (in {source})")
        m = _ARRAY_NAME.match(name)
        if m and int(m.group(1)) < world and (m.group(3) is None or int(m.group(3)) < groups):
            continue
        if m:
            what = (f"rank {m.group(1)} but the CP world is {world}" if int(m.group(1)) >= world else
                    f"group {m.group(3)} but {groups} group(s) are declared")
            raise ConfigError(field_name, f"array {name!r} names {what} (in {source})")
        known = list(_SHARED) + [f"r{r}/{n}" for r in range(min(world, 64)) for n in _SHARED + ("slots",)] + \
            [f"r{r}/g{g}/{n}" for r in range(min(world, 64)) for g in range(groups)
             for n in ("table", "num_blocks") + _GROUP_SHARED] + \
            [f"g{g}/{n}" for g in range(groups) for n in _GROUP_SHARED]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = (f"did you mean {close[0]!r}?" if close else
                f"arrays are {', '.join(_SHARED)} (shared, or r<R>/<name> per rank), r<R>/slots, r<R>/g<G>/table, "
                f"r<R>/g<G>/num_blocks, g<G>/positions and g<G>/req_indices (shared, or r<R>/g<G>/...)")
        raise ConfigError(field_name, f"unknown array {name!r}; {hint} (in {source})")


def _json_entries(value: list) -> int:
    """Entries of an inline array as written (rows of a 2-D one summed; anything else counts one)."""
    return sum(len(x) if isinstance(x, list) else 1 for x in value)


class _JsonArrays:
    """The arrays of the one-file JSON form, each checked (integers, int64, rectangular) when read."""

    def __init__(self, arrays: dict[str, list], source: str):
        self.arrays, self.source = arrays, source
        bounds.batch_fits("explicit.arrays", sum(_json_entries(v) for v in arrays.values()),
                          bounds.MAX_JSON_ENTRIES, f"the inline arrays of {source} (larger batches: .npz)")

    def names(self) -> list[str]:
        return list(self.arrays)

    def has(self, name: str) -> bool:
        return name in self.arrays

    def get(self, name: str, ndim: int, flags: bool = False) -> np.ndarray:
        label = f"explicit.arrays.{name}"
        if name not in self.arrays:
            raise ConfigError(label, f"is required (in {self.source})")
        kind = schema.FLAGS if flags else schema.ARRAY_1D if ndim == 1 else schema.ARRAY_2D
        value = parse_list(kind, self.arrays[name], label, self.source, "true/false or 0/1" if flags else None)
        if ndim == 2 and len({len(row) for row in value}) > 1:
            raise ConfigError(label, f"rows must have one length, got {sorted({len(row) for row in value})} "
                                     f"(in {self.source})")
        return np.array(value, dtype=np.int64).reshape((-1,) if ndim == 1 else (len(value), -1))


class _ArchiveArrays:
    """The ``.npy`` members of an explicit-batch archive."""

    def __init__(self, reader: ArchiveReader, source: str):
        self.reader, self.source = reader, source
        bounds.batch_fits("explicit.arrays", sum(reader.entries(n) for n in self.names()),
                          what=f"the arrays of {source}")  # from the headers: nothing is read yet

    def names(self) -> list[str]:
        return [n[: -len(".npy")] for n in self.reader.names if n.endswith(".npy")]

    def has(self, name: str) -> bool:
        return self.reader.has(name)

    def get(self, name: str, ndim: int, flags: bool = False) -> np.ndarray:
        return _int_array(self.reader.array(name), f"explicit.arrays.{name}", ndim, flags, self.source)


def is_explicit(path: str | Path) -> bool:
    """An explicit-batch file (as opposed to a capture or a repro file).

    A ``.npz`` is one by its suffix (so a broken archive is named as such); a JSON file when it
    holds ``format`` or ``arrays`` (so a wrong format or version is named, not read as a repro).
    """
    path = Path(path)
    if path.is_dir() or not path.is_file():
        return False
    if path.suffix == ".npz":
        return True
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError, RecursionError):
            return False
        return isinstance(data, dict) and "schema" not in data and ("format" in data or "arrays" in data)
    try:
        r = ArchiveReader(path)
    except ConfigError:
        return False
    try:
        return r.has("meta") and isinstance(r.json("meta"), dict) and r.json("meta").get("format") == FORMAT
    except ConfigError:
        return False
    finally:
        r.close()


def load(path: str | Path, field_name: str = "FILE") -> ExplicitStep:
    """An explicit batch, ``.json`` (arrays inline) or an archive; ConfigError (exit 2) on any bad key or value."""
    path = Path(path)
    if path.suffix == ".json":
        data = read_data(path, field_name, "explicit batch")
        m = parse(schema.ExplicitJsonModel, data, "explicit", str(path))
        return from_meta(m, _JsonArrays(m.arrays, str(path)), path.name)
    reader = ArchiveReader(path, field_name)
    try:
        meta = reader.json("meta")
        m = parse(schema.ExplicitMetaModel, meta, "explicit", f"{path}: meta.json")
        return from_meta(m, _ArchiveArrays(reader, str(path)), path.name)
    finally:
        reader.close()


def from_meta(m, src, source: str) -> ExplicitStep:
    """The step a checked ``schema.ExplicitMetaModel`` and its arrays describe."""
    cp = CPConfig(**m.cp.model_dump())
    limits = Limits(**m.limits.model_dump())
    groups = tuple(KVGroup(**g.model_dump(exclude={"entry_size"})) for g in m.groups)
    entry = tuple(kv.b if g.entry_size is None else g.entry_size for g, kv in zip(m.groups, groups))
    _check_names(src.names(), cp.world, len(groups), "explicit.arrays", src.source)
    rank_meta = m.ranks if m.ranks is not None else [schema.ExplicitRankModel()] * cp.world

    def arr(r: int, name: str, ndim: int, flags: bool = False) -> np.ndarray:
        key = f"r{r}/{name}" if src.has(f"r{r}/{name}") else name
        return src.get(key, ndim, flags)

    ranks = []
    for r, rm in enumerate(rank_meta):
        qsl = arr(r, "query_start_loc", 1)
        idx = arr(r, "idx_mapping", 1) if (src.has(f"r{r}/idx_mapping") or src.has("idx_mapping")) \
            else np.arange(max(len(qsl) - 1, 0), dtype=np.int64)
        pos = arr(r, "positions", 1)
        tables = [src.get(f"r{r}/g{gi}/table", 2) if src.has(f"r{r}/g{gi}/table") else None
                  for gi in range(len(groups))]
        live = [src.get(f"r{r}/g{gi}/num_blocks", 1) if src.has(f"r{r}/g{gi}/num_blocks") else None
                for gi in range(len(groups))]
        slots = src.get(f"r{r}/slots", 2) if src.has(f"r{r}/slots") else None
        own = {name: [arr(r, f"g{gi}/{name}", 1) if (src.has(f"r{r}/g{gi}/{name}") or src.has(f"g{gi}/{name}"))
                      else None for gi in range(len(groups))] for name in _GROUP_SHARED}
        starts = arr(r, "replay_start", 1) if (src.has(f"r{r}/replay_start") or src.has("replay_start")) else None
        padded = rm.num_tokens_padded if rm.num_tokens_padded is not None else (int(qsl[-1]) if len(qsl) else 0)
        pad = None
        if src.has(f"r{r}/is_padding") or src.has("is_padding"):
            pad = arr(r, "is_padding", 1, flags=True).astype(bool)
        ranks.append(RankBatch(pos, qsl, idx, padded, tables, slots, pad,
                               live if any(x is not None for x in live) else None, starts,
                               *(own[n] if any(x is not None for x in own[n]) else None for n in _GROUP_SHARED)))
    try:
        return validate(ExplicitStep(m.path, cp, groups, entry, limits, ranks, dict(m.label) | {"source": source}))
    except ConfigError as e:  # shapes and ids that disagree: name the file too
        raise ConfigError(e.field, f"{e.rule} (in {src.source})") from None

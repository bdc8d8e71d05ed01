"""Read capture files back as explicit steps: the files of all ranks *are* the all-gather.

A step's launches on one rank form the units replay checks: the per-group (v1
family) launches of a step together, and every multi-group (v2 family) launch on
its own; the k-th unit of a family on one rank is matched with the k-th on every
other rank. Kernel arguments carry the CP layout, block sizes and tables; what
they do not carry (``max_model_len``, cache sizes, buffer limits) comes from the
capture's ``meta`` or is inferred so that the checks it feeds stay consistent
(noted in the step's label).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from cpsim import schema
from cpsim.capture.archive import ArchiveReader
from cpsim.capture.batch import ExplicitStep, RankBatch, _int_array, validate
from cpsim.capture.recorder import FORMAT, SUFFIX
from cpsim.errors import ConfigError
from cpsim.parsing import parse
from cpsim.layout import PAD_SLOT_ID
from cpsim.scenario import CPConfig, KVGroup, Limits

_MEMBER = re.compile(r"^s(\d{8})/c(\d{3})/meta\.json$")


@dataclass
class Call:
    file_rank: int
    step: int
    call: int
    meta: dict[str, Any]
    reader: ArchiveReader

    def array(self, name: str) -> np.ndarray:
        return self.reader.array(f"s{self.step:08d}/c{self.call:03d}/{name}")

    def ints(self, name: str, ndim: int | None = 1) -> np.ndarray:
        """An integer (or bool) array of the launch as int64; ConfigError naming the member otherwise."""
        member = f"{self.reader.path.name}: s{self.step:08d}/c{self.call:03d}/{name}.npy"
        a = self.array(name)
        return _int_array(a, f"capture.arrays.{name}", a.ndim if ndim is None else ndim, a.dtype == bool, member)

    def has(self, name: str) -> bool:
        return self.reader.has(f"s{self.step:08d}/c{self.call:03d}/{name}")

    def scalar(self, name: str, default: Any = None) -> Any:
        """A scalar argument of the launch (typed and bounded by ``schema.LaunchScalarsModel``)."""
        value = self.meta.get("scalars", {}).get(name, default)
        if value is None:
            raise ConfigError(f"capture.scalars.{name}", f"is required for a {self.meta.get('family')} launch "
                                                         f"(in {self.reader.path.name}: s{self.step:08d}/"
                                                         f"c{self.call:03d}/meta.json)")
        return value


@dataclass
class Capture:
    files: dict[int, ArchiveReader]
    headers: dict[int, dict[str, Any]]
    index: dict[int, dict[int, list[Call]]] = field(default_factory=dict)  # step -> file rank -> calls
    truncated: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def meta(self) -> dict[str, Any]:
        for h in self.headers.values():
            if h.get("meta"):
                return h["meta"]
        return {}


def is_capture(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and any(p.glob(f"rank*{SUFFIX}")) or (p.is_file() and p.suffix == SUFFIX)


def open_capture(path: str | Path) -> Capture:
    p = Path(path)
    files = sorted(p.glob(f"rank*{SUFFIX}")) if p.is_dir() else [p]
    if not files:
        raise ConfigError("capture", f"{p} holds no rank*{SUFFIX} files")
    cap = Capture({}, {})
    for f in files:
        reader = ArchiveReader(f, "capture")
        raw = reader.json("capture")
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            got = raw.get("format") if isinstance(raw, dict) else raw
            raise ConfigError("capture", f"{f.name} is not a cpsim capture (format {got!r}, expected {FORMAT!r})")
        header = parse(schema.CaptureHeaderModel, raw, "capture", f"{f.name}: capture.json").model_dump(exclude_none=True)
        rank = header["rank"]
        if rank in cap.files:
            raise ConfigError("capture", f"two files claim rank {rank} ({f.name})")
        cap.files[rank], cap.headers[rank] = reader, header
        if reader.has("truncated"):
            cap.truncated[rank] = parse(schema.CaptureTruncatedModel, reader.json("truncated"), "capture.truncated",
                                        f"{f.name}: truncated.json").model_dump()
        for name in sorted(reader.names):
            m = _MEMBER.match(name)
            if m:
                step, call = int(m.group(1)), int(m.group(2))
                launch = parse(schema.LaunchModel, reader.json(name[: -len(".json")]), "capture", f"{f.name}: {name}")
                meta = launch.model_dump(exclude_none=True, exclude={"scalars"})
                meta["scalars"] = launch.scalars.model_dump(exclude_unset=True)
                cap.index.setdefault(step, {}).setdefault(rank, []).append(Call(rank, step, call, meta, reader))
    return cap


def units(cap: Capture) -> Iterator[tuple[int, str, dict[int, list[Call]]]]:
    """(step, unit name, file rank -> calls) in step order."""
    for step in sorted(cap.index):
        per_rank = cap.index[step]
        names: dict[str, dict[int, list[Call]]] = {}
        for rank, calls in per_rank.items():
            v2_seen = 0
            host_seen: dict[str, int] = {}
            for c in sorted(calls, key=lambda c: c.call):
                fam = c.meta.get("family")
                if fam in ("host-v1", "host-v2"):  # one host-class call is one unit (cpsim.capture.hosts)
                    k = host_seen.get(fam, 0)
                    names.setdefault(f"{fam}#{k}", {}).setdefault(rank, []).append(c)
                    host_seen[fam] = k + 1
                elif fam == "v1":
                    names.setdefault("v1", {}).setdefault(rank, []).append(c)
                elif fam == "v2":
                    names.setdefault(f"v2#{v2_seen}", {}).setdefault(rank, []).append(c)
                    v2_seen += 1
                else:
                    names.setdefault(f"unsupported:{c.meta.get('kernel')}", {}).setdefault(rank, []).append(c)
        for name in sorted(names, key=lambda n: (n.startswith("unsupported"), n)):
            yield step, name, names[name]


def _positions_qsl(c: Call, pos_name: str, qsl_name: str) -> tuple[np.ndarray, np.ndarray]:
    return c.ints(pos_name), c.ints(qsl_name)


def _group_limits(step_groups: list[dict], tables: list[list[np.ndarray | None]], meta: dict, world: int,
                  entries: int, num_reqs: int) -> tuple[tuple[KVGroup, ...], Limits, list[str]]:
    """KV groups and limits from the launch arguments, the capture's meta, and inference."""
    notes = []
    true_sizes = meta.get("block_sizes")
    if true_sizes is not None:
        # The deployment's physical block sizes: a kernel handed a wrong KV_CACHE_BLOCK_SIZE
        # (virtual-block-uses-kernel-block) is then judged against the real layout.
        if not isinstance(true_sizes, list) or len(true_sizes) != len(step_groups):
            raise ConfigError("meta.block_sizes", f"needs one physical block size per launched group "
                                                  f"({len(step_groups)}), got {true_sizes!r}")
        for gd, B in zip(step_groups, true_sizes):
            if not isinstance(B, int) or B < gd["entry"] or B % gd["entry"]:
                raise ConfigError("meta.block_sizes", f"{B!r} must be a multiple of the table entry size {gd['entry']}")
            gd["block_size"] = B
    given_blocks = meta.get("num_blocks")
    names = meta.get("group_names") or []
    groups = []
    widths = []
    for gi, gd in enumerate(step_groups):
        B, e = gd["block_size"], gd["entry"]
        per = B // e
        ts = [t[gi] for t in tables if t[gi] is not None]
        top = max((int(t.max()) // per for t in ts if t.size), default=0)
        if isinstance(given_blocks, list) and gi < len(given_blocks):
            nb = int(given_blocks[gi])
        elif isinstance(given_blocks, int):
            nb = given_blocks
        else:
            nb = top + 1
        w = max((t.shape[1] // per for t in ts), default=1)
        widths.append((w, B, gd))
        groups.append(KVGroup(names[gi] if gi < len(names) else f"g{gi}", gd["kind"], B,
                              gd["kernel_block"] if gd["kernel_block"] != B else 0, gd["sharded"], nb))
    if given_blocks is None:
        notes.append("num_blocks inferred from the highest table id (give meta num_blocks to bound the cache)")
    mml = meta.get("max_model_len")
    if mml is None:
        sharded = [w * B * world for w, B, gd in widths if gd["sharded"] and gd["kind"] == "attention"]
        other = [w * B for w, B, gd in widths if gd["kind"] == "attention"]
        mml = min(sharded or other or [1])
        notes.append(f"max_model_len {mml} inferred from table widths (give meta max_model_len to check block-sizing)")
    limits = Limits(int(mml), int(meta.get("max_num_reqs", max(num_reqs, 1))),
                    int(meta.get("max_num_batched_tokens", entries)), int(meta.get("num_speculative_tokens", 0)))
    return tuple(groups), limits, notes


def _order(per_rank: dict[int, Any], cp_rank_of: dict[int, int | None], world: int, where: str) -> list[int]:
    """File ranks sorted by CP rank (from the kernel arguments when a group is sharded)."""
    cp = {fr: (cr if cr is not None else fr) for fr, cr in cp_rank_of.items()}
    by_cp = {}
    for fr, cr in cp.items():
        if cr in by_cp:
            raise ConfigError("ranks", f"{where}: files of ranks {by_cp[cr]} and {fr} both ran CP rank {cr}")
        by_cp[cr] = fr
    missing = [r for r in range(world) if r not in by_cp]
    if missing:
        raise ConfigError("ranks", f"{where}: CP world {world} but rank(s) {missing} have no launch here "
                                   f"(file(s) missing or capture cut short)")
    return [by_cp[r] for r in range(world)]


def _v1_step(step: int, name: str, per_rank: dict[int, list[Call]], meta: dict, source: str) -> ExplicitStep:
    where = f"step {step} {name}"
    counts = {r: len(c) for r, c in per_rank.items()}
    if len(set(counts.values())) != 1:
        raise ConfigError("capture", f"{where}: ranks launched different numbers of groups {counts}")
    first = next(iter(per_rank.values()))
    world = max(int(c.scalar("TOTAL_CP_WORLD_SIZE", 1)) for calls in per_rank.values() for c in calls)
    interleave = int(first[0].scalar("CP_KV_CACHE_INTERLEAVE_SIZE", 1))
    unsharded_world = world == 1 and len(per_rank) > 1
    if unsharded_world:
        world = len(per_rank)
    cp_rank_of = {}
    for fr, calls in per_rank.items():
        shard = [int(c.scalar("TOTAL_CP_RANK", 0)) for c in calls if int(c.scalar("TOTAL_CP_WORLD_SIZE", 1)) > 1]
        cp_rank_of[fr] = shard[0] if shard else None
    order = _order(per_rank, cp_rank_of, world, where)
    step_groups = []
    for c in first:
        B, b = int(c.scalar("KV_CACHE_BLOCK_SIZE")), int(c.scalar("block_size"))
        circ = bool(c.scalar("IS_CIRCULAR", False))
        step_groups.append({"block_size": B, "entry": b, "kernel_block": b,
                            "kind": "sliding_window" if circ else "attention",
                            "sharded": int(c.scalar("TOTAL_CP_WORLD_SIZE", 1)) > 1 or world == 1})
    ranks, tables = [], []
    for fr in order:
        calls = per_rank[fr]
        pos, qsl = _positions_qsl(calls[0], "positions_ptr", "query_start_loc_ptr")
        T = int(calls[0].scalar("max_num_tokens"))
        slots = np.full((len(calls), T), PAD_SLOT_ID, dtype=np.int64)
        ts = []
        for gi, c in enumerate(calls):
            out = c.ints("slot_mapping_ptr")
            slots[gi, : min(T, len(out))] = out[:T]
            ts.append(c.ints("block_table_ptr", 2))
        tables.append(ts)
        padded = min(int(calls[0].scalar("num_tokens", qsl[-1])), len(pos))
        live = [c.ints("live/g0") if c.has("live/g0") else None for c in calls]  # the host's, one per launch
        ranks.append(RankBatch(pos, qsl, np.arange(len(qsl) - 1, dtype=np.int64), max(padded, int(qsl[-1])), ts,
                               slots, num_blocks=live if any(x is not None for x in live) else None))
    groups, limits, notes = _group_limits(step_groups, tables, meta, world, ranks[0].slots.shape[1],
                                          ranks[0].num_reqs)
    label = {"step": step, "unit": name, "source": source, "file_ranks": order, "notes": notes,
             "kernels": sorted({c.meta.get("kernel") for calls in per_rank.values() for c in calls}),
             "name": f"step {step} {name}"}
    return validate(ExplicitStep("v1", CPConfig(dcp=world, interleave=interleave), groups,
                                 tuple(g["entry"] for g in step_groups), limits, ranks, label))


def _v2_step(step: int, name: str, per_rank: dict[int, list[Call]], meta: dict, source: str) -> ExplicitStep:
    where = f"step {step} {name}"
    calls = {fr: cs[0] for fr, cs in per_rank.items()}
    first = next(iter(calls.values()))
    world = int(first.scalar("CP_SIZE", 1))
    interleave = int(first.scalar("CP_INTERLEAVE", 1))
    if world == 1 and len(calls) > 1:
        world = len(calls)
    order = _order(calls, {fr: int(c.scalar("cp_rank", fr)) if int(c.scalar("CP_SIZE", 1)) > 1 else None
                           for fr, c in calls.items()}, world, where)
    sizes = first.ints("block_sizes")
    G = len(sizes)
    kbs = first.ints("kernel_block_sizes") if first.has("kernel_block_sizes") else sizes
    cps = first.ints("group_cp_sizes") if first.has("group_cp_sizes") \
        else np.full(G, int(first.scalar("CP_SIZE", 1)))
    enabled = first.ints("slot_mapping_enabled") if first.has("slot_mapping_enabled") else np.ones(G)
    circ = first.ints("is_circular") if first.has("is_circular") else np.zeros(G)
    if not (len(kbs) == len(cps) == len(enabled) == len(circ) == G) or (sizes < 1).any() or (kbs < 1).any():
        raise ConfigError("capture", f"{where}: per-group arguments disagree (block_sizes {sizes.tolist()}, "
                                     f"kernel_block_sizes {kbs.tolist()}, {len(cps)} CP sizes, {len(enabled)} "
                                     f"enabled flags, {len(circ)} circular flags)")
    step_groups = [{"block_size": int(sizes[g]), "entry": int(kbs[g]), "kernel_block": int(kbs[g]),
                    "kind": "mamba" if not enabled[g] else ("sliding_window" if circ[g] else "attention"),
                    "sharded": int(cps[g]) > 1 or world == 1} for g in range(G)]
    ranks, tables = [], []
    for fr in order:
        c = calls[fr]
        pos, qsl = _positions_qsl(c, "pos", "query_start_loc")
        idx = c.ints("idx_mapping")
        T = int(c.scalar("max_num_tokens"))
        out = c.ints("slot_mappings_ptr", None)
        if out.size % G:
            raise ConfigError("capture", f"{where}: slot_mappings_ptr holds {out.size} entries, not a multiple of "
                                         f"{G} groups (file rank {fr})")
        out = out.reshape(G, -1)[:, :T]
        ts = [c.ints(f"table{g}", 2) for g in range(G)]
        tables.append(ts)
        padded = min(int(c.scalar("num_tokens", qsl[-1])), len(pos))
        pad = c.ints("is_padding").astype(bool)[: int(qsl[-1])] if c.has("is_padding") else None
        ranks.append(RankBatch(pos, qsl, idx, max(padded, int(qsl[-1])), ts, out, pad, _v2_live(c, ts)))
    groups, limits, notes = _group_limits(step_groups, tables, meta, world, T, ranks[0].num_reqs)
    label = {"step": step, "unit": name, "source": source, "file_ranks": order, "notes": notes,
             "kernels": sorted({c.meta.get("kernel") for c in calls.values()}), "name": f"step {step} {name}"}
    return validate(ExplicitStep("v2", CPConfig(dcp=world, interleave=interleave), groups,
                                 tuple(g["entry"] for g in step_groups), limits, ranks, label))


def _v2_live(c: Call, tables: list[np.ndarray]) -> list[np.ndarray | None] | None:
    """Each group's live entries per table row: the host's (``Recorder.live_blocks``), else the launch's own
    ``num_blocks_ptr`` ([groups, rows], cpsim-mrv2), else None (read off the rows, as older captures)."""
    G = len(tables)
    if any(c.has(f"live/g{g}") for g in range(G)):
        return [c.ints(f"live/g{g}") if c.has(f"live/g{g}") else None for g in range(G)]
    if not c.has("num_blocks_ptr"):
        return None
    nb = c.ints("num_blocks_ptr", None)
    nb = nb.reshape(G, -1) if nb.ndim == 1 and nb.size % max(G, 1) == 0 else nb
    if nb.ndim != 2 or nb.shape[0] < G or any(nb.shape[1] < t.shape[0] for t in tables):
        raise ConfigError("capture.arrays.num_blocks_ptr", f"shape {nb.shape} does not give each of {G} groups "
                                                           f"a count per table row")
    return [nb[g, : t.shape[0]] for g, t in enumerate(tables)]


def _host_step(step: int, name: str, per_rank: dict[int, list[Call]], meta: dict, source: str) -> ExplicitStep:
    """A host-class call per rank (cpsim.capture.hosts): the object's tables, live counts, slot buffers."""
    where = f"step {step} {name}"
    calls = {fr: cs[0] for fr, cs in per_rank.items()}
    first = next(iter(calls.values()))
    host = first.meta["host"]
    path = "v2" if name.startswith("host-v2") else "v1"
    world = max(g["cp_world"] for g in host["groups"])
    interleave = host["groups"][0]["interleave"]
    for fr, c in calls.items():
        h = c.meta["host"]
        if len(h["groups"]) != len(host["groups"]) or [(g["block_size"], g["entry_size"], g["kind"]) for g in
                                                        h["groups"]] != [(g["block_size"], g["entry_size"], g["kind"])
                                                                         for g in host["groups"]]:
            raise ConfigError("capture", f"{where}: file rank {fr}'s host object has other groups than "
                                         f"file rank {next(iter(calls))}'s")
    order = _order(calls, {fr: c.meta["host"]["groups"][0]["cp_rank"] for fr, c in calls.items()}, world, where)
    step_groups = [{"block_size": g["block_size"], "entry": g["entry_size"], "kernel_block": g["entry_size"],
                    "kind": g["kind"], "sharded": g["sharded"] and (g["cp_world"] > 1 or world == 1)}
                   for g in host["groups"]]
    G = len(step_groups)
    ranks, tables = [], []
    for fr in order:
        c = calls[fr]
        pos, qsl = c.ints("positions"), c.ints("query_start_loc")
        idx = c.ints("idx_mapping") if c.has("idx_mapping") else np.arange(len(qsl) - 1, dtype=np.int64)
        ts = [c.ints(f"g{g}/table", 2) for g in range(G)]
        bufs = [c.ints(f"g{g}/slots") for g in range(G)]
        mapped = [b for b, gd in zip(bufs, step_groups) if gd["kind"] != "mamba"] or bufs
        entries = min(b.size for b in mapped)
        slots = np.full((G, entries), PAD_SLOT_ID, dtype=np.int64)
        for g, b in enumerate(bufs):
            slots[g, : min(entries, b.size)] = b[:entries]
        live = [c.ints(f"g{g}/num_blocks") if c.has(f"g{g}/num_blocks") else None for g in range(G)]
        padded = int(c.meta["host"]["num_tokens_padded"])
        if padded > len(pos):
            pos = np.concatenate([pos, np.zeros(padded - len(pos), dtype=np.int64)])
        tables.append(ts)
        ranks.append(RankBatch(pos, qsl, idx, max(padded, int(qsl[-1])), ts, slots,
                               num_blocks=live if any(x is not None for x in live) else None))
    # What the host object knows (buffer sizes) unless the capture's meta says otherwise.
    known = {"max_num_reqs": host["groups"][0]["max_num_reqs"],
             "max_num_batched_tokens": host["groups"][0]["max_num_batched_tokens"]} | meta
    groups, limits, notes = _group_limits(step_groups, tables, known, world, ranks[0].slots.shape[1],
                                          ranks[0].num_reqs)
    label = {"step": step, "unit": name, "source": source, "file_ranks": order, "notes": notes,
             "kernels": sorted({c.meta.get("kernel") for c in calls.values()}), "name": f"step {step} {name}"}
    return validate(ExplicitStep(path, CPConfig(dcp=world, interleave=interleave), groups,
                                 tuple(g["entry"] for g in step_groups), limits, ranks, label))


def to_step(cap: Capture, step: int, name: str, per_rank: dict[int, list[Call]], source: str) -> ExplicitStep:
    if name.startswith("host-"):
        return _host_step(step, name, per_rank, cap.meta, source)
    if name == "v1":
        return _v1_step(step, name, per_rank, cap.meta, source)
    if name.startswith("v2#"):
        return _v2_step(step, name, per_rank, cap.meta, source)
    raise ConfigError("capture", f"step {step}: {name.split(':', 1)[1]} has an ABI replay cannot read yet "
                                 f"(v1 per-group and v2 multi-group kernels are supported)")


def steps(path: str | Path, notes: list[str] | None = None) -> Iterator[ExplicitStep]:
    """Every unit in step order. Steps from where a rank's budget ran out are skipped (said in ``notes``)."""
    cap = open_capture(path)
    cut = min((int(t.get("step", 0)) for t in cap.truncated.values()), default=None)
    for step, name, per_rank in units(cap):
        if cut is not None and step >= cut:
            if notes is not None:
                notes.append(f"the capture budget ran out at step {cut} on rank(s) {sorted(cap.truncated)}: "
                             f"steps from {cut} on were not checked")
            return
        yield to_step(cap, step, name, per_rank, str(path))

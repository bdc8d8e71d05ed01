"""A picture of one scenario's CP layout: who owns each token and where it landed.

A table of violation counts says *that* something broke; this figure shows *how*.
For every drawn path (columns, v1 and v2 side by side) and KV-cache group (rows):

* a token strip: the scheduled positions of every request, wrapped at a width that
  is a multiple of ``N * I`` so a healthy layout shows clean vertical bands, each
  token coloured by the rank that actually holds a real slot for it;
* a block grid: one row per (rank, physical block) that received a token this
  step, one cell per slot offset ``0 .. B-1``, each cell coloured by the rank the
  global rule says owns the position written there (so a healthy rank's rows are
  one colour, and a rank holding foreign tokens shows other colours).

Tokens whose slot differs from the reference on any rank get a red outline; each
coordinator violation is annotated with its invariant's name at its first example,
and listed in the panel's title. Colours are the same everywhere: one per rank,
grey for "every rank" (unsharded groups), pale red for "no rank", black for
"several" (a collision or a token held twice).

``build`` lays the picture out as plain arrays (a ``Picture``); ``cpsim.report.figure`` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from cpsim.check import coordinator, reference

from cpsim import layout
from cpsim.allocator import Allocation, allocate_world
from cpsim.errors import ConfigError
from cpsim.layout import PAD_SLOT_ID, POISON
from cpsim.scenario import KVGroup, Scenario

# Beyond these the figure stops being readable; we refuse rather than draw mush.
MAX_RANKS = 16
MAX_REQUESTS = 64
MAX_TOKENS = 4096
MAX_BLOCK_SIZE = 512
MAX_STRIP_ROWS = 160        # wrapped token rows per group
MAX_BLOCK_ROWS = 480        # (rank, block) rows per path, all groups together
MAX_STRAY_ROWS = 16         # rows for blocks a rank was never given, per panel
DEFAULT_PATHS = ("v1", "v2")


@dataclass
class Panel:
    """Everything drawn for one (path, group), as plain arrays (testable without matplotlib)."""

    path: str
    group: KVGroup
    enabled: bool
    strip: np.ndarray                      # [strip rows, W] code, -1 = no token
    strip_bad: np.ndarray                  # [strip rows, W] bool
    strip_labels: list[str]
    blocks: np.ndarray                     # [block rows, B] code, -1 = empty slot
    blocks_bad: np.ndarray                 # [block rows, B] bool
    block_labels: list[str]
    block_keys: list[tuple[int, int]]      # (rank, physical block id) of each block row
    stray_dropped: int = 0
    note: str = ""
    marks: list[tuple[str, str, int, int]] = field(default_factory=list)  # (invariant, "strip"|"blocks", row, col)
    violations: list[coordinator.Violation] = field(default_factory=list)


@dataclass
class Picture:
    scenario: Scenario
    paths: list[str]
    panels: dict[tuple[str, int], Panel]
    verdicts: list[coordinator.Verdict]
    width: int
    skipped: list[str]


# ---- size guard ------------------------------------------------------------------

def strip_width(s: Scenario) -> int:
    """Wrap width: a multiple of N*I (so each rank is one band), between 64 and 256 when possible."""
    unit = s.cp.world * s.cp.interleave
    if unit > 256:
        return 256
    return unit * max(1, -(-64 // unit))


def _strip_rows(s: Scenario, w: int) -> int:
    return sum(((r.seq_len - 1) // w - r.context_len // w + 1) if r.num_tokens else 1 for r in s.batch.requests)


def check_size(s: Scenario, allocs_world: list[list[Allocation]] | None = None) -> dict[int, torch.Tensor]:
    """Raise ConfigError when the scenario is too big to draw readably; else the reference slots the picture
    is drawn against (``reference.expected`` over ``allocs_world``, default the scenario's own allocation),
    for :func:`build`."""
    def too_big(what: str, value: int, limit: int) -> None:
        if value > limit:
            raise ConfigError("draw", f"scenario {s.name!r} is too big to draw: {what} {value} > {limit}; "
                                      f"draw a smaller scenario (fewer ranks, requests or tokens)")
    too_big("CP world size", s.cp.world, MAX_RANKS)
    too_big("requests", s.batch.num_reqs, MAX_REQUESTS)
    too_big("scheduled tokens", s.batch.num_tokens, MAX_TOKENS)
    too_big("physical block size", max(g.block_size for g in s.groups), MAX_BLOCK_SIZE)
    too_big("wrapped token rows", _strip_rows(s, strip_width(s)), MAX_STRIP_ROWS)
    refs = reference.expected(s, allocs_world if allocs_world is not None else allocate_world(s))
    rows = 0
    for gi, ref in refs.items():  # replicas (r >= the group's CP size) are drawn only where they differ
        mine = ref[:s.groups[gi].world(s.cp)]
        rows += sum(len(torch.unique(x[x != PAD_SLOT_ID] // s.groups[gi].block_size)) for x in mine)
    too_big("touched (rank, block) rows", rows, MAX_BLOCK_ROWS)
    return refs


# ---- data ------------------------------------------------------------------------

def _real(x: torch.Tensor) -> torch.Tensor:
    return (x != PAD_SLOT_ID) & (x != POISON)


def _codes(world: int) -> tuple[int, int, int]:
    """Codes after the rank colours: every rank, no rank, several ranks."""
    return world, world + 1, world + 2


def _panel(s: Scenario, path: str, gi: int, G, allocs_world: list[list[Allocation]],
           refs: torch.Tensor, w: int, drawn: dict) -> Panel:
    g = s.groups[gi]
    R = s.cp.world
    ALL, NONE, SEVERAL = _codes(R)
    pos = torch.from_numpy(s.batch.positions())
    req = torch.from_numpy(s.batch.token_request())
    n = int(pos.numel())
    full = G.slots[:, gi, :]
    x = full[:, :n] if full.shape[1] >= n else torch.cat(
        [full, torch.full((R, n - full.shape[1]), POISON, dtype=full.dtype)], 1)
    enabled = bool(G.enabled[:, gi].any())
    real = _real(x)
    gw = g.world(s.cp)
    bad_tok = (x != refs).any(0) if enabled and g.slot_mapped else torch.zeros(n, dtype=torch.bool)

    # Token strip: one row per (request, p // w).
    row_of: dict[tuple[int, int], int] = {}
    labels: list[str] = []
    for i, r in enumerate(s.batch.requests):
        if not r.num_tokens:
            row_of[(i, -1)] = len(labels)
            labels.append(f"req{i} {r.kind} (no tokens)")
            continue
        for k in range(r.context_len // w, (r.seq_len - 1) // w + 1):
            row_of[(i, k)] = len(labels)
            labels.append(f"req{i} {r.kind} p{k * w}" if k == r.context_len // w else f"p{k * w}")
    strip = np.full((len(labels), w), -1, dtype=np.int64)
    strip_bad = np.zeros_like(strip, dtype=bool)
    # A partially replicated group (1 < g < N) is drawn from its first replica set; the
    # other sets show up in the block grid, and their mismatches as outlines.
    first = real[:gw] if 1 < gw < R else real
    cnt = first.sum(0)
    holder = first.to(torch.int64).argmax(0)
    code = torch.where(cnt == 1, holder, torch.full_like(holder, SEVERAL))
    code = torch.where(cnt == 0, torch.full_like(code, NONE), code)
    if gw == 1 and R > 1:
        code = torch.where(cnt == R, torch.full_like(code, ALL), code)
    rows = np.array([row_of[(int(i), int(p) // w)] for i, p in zip(req, pos)], dtype=np.int64)
    cols = (pos % w).numpy()
    if enabled and g.slot_mapped:
        strip[rows, cols] = code.numpy()
        strip_bad[rows, cols] = bad_tok.numpy()

    # Block grid: rows (rank, physical block) in the union the caller collected.
    keys = drawn[gi]["rows"]
    index = {k: j for j, k in enumerate(keys)}
    B = g.block_size
    blocks = np.full((len(keys), B), -1, dtype=np.int64)
    blocks_bad = np.zeros_like(blocks, dtype=bool)
    want = layout.owner_rank(pos, gw, s.cp.interleave) if gw > 1 else torch.full_like(pos, ALL)
    writers: dict[tuple[int, int], set[int]] = {}
    if enabled and g.slot_mapped:
        for r in range(R):
            idx = real[r].nonzero().flatten()
            sl = x[r, idx]
            for t, slot in zip(idx.tolist(), sl.tolist()):
                j = index.get((r, slot // B))
                if j is None:
                    continue
                o = slot % B
                writers.setdefault((j, o), set()).add(int(req[t]) if g.circular else t)
                # Owner inside this rank's replica set, so a healthy rank's rows are its own colour.
                blocks[j, o] = int(want[t]) + (r // gw) * gw if 1 < gw < R else int(want[t])
                if slot != int(refs[r, t]):
                    blocks_bad[j, o] = True
        for (j, o), who in writers.items():
            if len(who) > 1:
                blocks[j, o] = SEVERAL
                blocks_bad[j, o] = True
    note = "" if g.slot_mapped else f"{g.kind} group: no per-token slots"
    if g.slot_mapped and not enabled:
        note = f"{path} does not map group {g.name}"
    return Panel(path, g, enabled, strip, strip_bad, labels, blocks, blocks_bad,
                 drawn[gi]["labels"], list(keys), drawn[gi]["stray"], note)


def _rows_for_group(s: Scenario, gi: int, gathered: dict, paths: list[str],
                    allocs_world: list[list[Allocation]], refs: torch.Tensor) -> dict:
    """Union of (rank, block) rows over the drawn paths and the reference, so columns align."""
    g = s.groups[gi]
    R = s.cp.world
    B = g.block_size
    n = int(refs.shape[1])
    owned: list[dict[int, tuple[int, int]]] = []
    for r in range(R):
        owned.append({int(q): (i, k) for i, blk in enumerate(allocs_world[r][gi].blocks)
                      for k, q in enumerate(blk.tolist())})
    found: set[tuple[int, int]] = set()
    for r in range(R):
        sources = [refs[r]]
        for p in paths:
            G = gathered[p]
            if not bool(G.enabled[r, gi]):
                continue
            xr = G.slots[r, gi, :n]
            if r >= g.world(s.cp) and not bool((xr != refs[r, : xr.shape[0]]).any()):
                continue   # a replica (r >= g; every r > 0 when unsharded) drawn only when it differs
            sources.append(xr)
        if r >= g.world(s.cp) and len(sources) == 1:
            continue
        for src in sources:
            sl = src[_real(src)]
            found |= {(r, int(q)) for q in torch.unique(torch.div(sl, B, rounding_mode="floor")).tolist()}
    mine = sorted((k for k in found if k[1] in owned[k[0]]), key=lambda k: (k[0], *owned[k[0]][k[1]]))
    stray = sorted(k for k in found if k[1] not in owned[k[0]])
    dropped = max(0, len(stray) - MAX_STRAY_ROWS)
    stray = stray[:MAX_STRAY_ROWS]
    rows = sorted(mine + stray, key=lambda k: (k[0], 0 if k in set(mine) else 1,
                                               owned[k[0]].get(k[1], (1 << 30, k[1]))))
    labels = []
    for r, q in rows:
        if q in owned[r]:
            i, k = owned[r][q]
            labels.append(f"r{r} req{i} #{k} (blk {q})")
        else:
            labels.append(f"r{r} blk {q}: not its block")
    return {"rows": rows, "labels": labels, "stray": dropped}


def build(s: Scenario, gathered: dict, allocs_world: list[list[Allocation]],
          verdicts: list[coordinator.Verdict], paths: list[str] | None = None,
          refs: dict[int, torch.Tensor] | None = None) -> Picture:
    """Arrays for every (path, group) panel plus where each violation is marked; ``refs``: what
    :func:`check_size` returned for ``allocs_world``."""
    paths = [p for p in (paths or list(gathered)) if p in gathered]
    skipped = [p for p in (paths or []) if p not in gathered]
    w = strip_width(s)
    pos = torch.from_numpy(s.batch.positions())
    req = torch.from_numpy(s.batch.token_request())
    tok = {(int(i), int(p)): t for t, (i, p) in enumerate(zip(req.tolist(), pos.tolist()))}
    panels: dict[tuple[str, int], Panel] = {}
    # mamba / state groups have no per-token slots (no reference): their violations go in the title
    for gi, ref in (refs if refs is not None else reference.expected(s, allocs_world)).items():
        drawn = {gi: _rows_for_group(s, gi, gathered, paths, allocs_world, ref)}
        for p in paths:
            panels[(p, gi)] = _panel(s, p, gi, gathered[p], allocs_world, ref, w, drawn)
    for v in verdicts:
        for vio in v.violations:
            gi = next((i for i, g in enumerate(s.groups) if g.name == vio.group), None)
            if gi is None or (vio.path, gi) not in panels:
                continue
            panel = panels[(vio.path, gi)]
            panel.violations.append(vio)
            if any(m[0] == vio.invariant for m in panel.marks):
                continue
            mark = _locate(s, panel, vio, tok, gathered[vio.path], gi, w)
            if mark:
                panel.marks.append((vio.invariant, *mark))
    for panel in panels.values():  # every violated invariant gets its callout, with no arrow when it has no cell
        for inv in dict.fromkeys(v.invariant for v in panel.violations):
            if not any(m[0] == inv for m in panel.marks):
                panel.marks.append((inv, "note", 0, 0))
    return Picture(s, paths, panels, verdicts, w, skipped)


def _locate(s: Scenario, panel: Panel, vio, tok: dict, G, gi: int, w: int) -> tuple[str, int, int] | None:
    """Where to point at a violation's first locatable example: its slot, else its token."""
    B = panel.group.block_size
    for e in vio.examples:
        if e.request is None or e.position is None or (e.request, e.position) not in tok:
            continue
        t = tok[(e.request, e.position)]
        if e.rank is not None and t < G.slots.shape[2]:
            slot = int(G.slots[e.rank, gi, t])
            if slot not in (PAD_SLOT_ID, POISON):
                if (e.rank, slot // B) in panel.block_keys:
                    return "blocks", panel.block_keys.index((e.rank, slot // B)), slot % B
        row = _strip_row(s, e.request, e.position, w)
        return "strip", row, e.position % w
    for e in vio.examples:  # an entry with no token (padding, the tail): the block its wrong slot landed in
        if e.rank is not None and str(e.actual).lstrip("-").isdigit():
            slot = int(e.actual)
            if slot >= 0 and (e.rank, slot // B) in panel.block_keys:
                return "blocks", panel.block_keys.index((e.rank, slot // B)), slot % B
    return None


def _strip_row(s: Scenario, request: int, position: int, w: int) -> int:
    row = 0
    for i, r in enumerate(s.batch.requests):
        if i == request:
            return row + position // w - r.context_len // w
        row += ((r.seq_len - 1) // w - r.context_len // w + 1) if r.num_tokens else 1
    raise ValueError(f"request {request} not in batch")

"""A rank run's preparation: the one object through which a path gets its inputs - the seam the
world hands in.

A path's rank run reads top to bottom - inputs, launches, read-back - and asks a
``PerRank`` for everything it hands its kernels: the batch tensors and small host arrays
(``batch``, ``shared``), its guarded output buffers (``buffer``) and block tables (``table``),
and, after the launches, for its outputs on the host (``read_back``). It also keeps what the run
records on the way: the group of the launch in progress (``launch``, named when a kernel raises)
and, for a user's kernel, the entries it wrote into its inputs (``count_writes``, ``bracket``).
Two implementations:

- ``PerRank``: made for this rank run alone; each call is one upload (pinned on CUDA), one
  allocation or one table fill. A user's kernel always gets these (fresh inputs per run).
- ``Staged``: one rank's view of a ``Stage``, the ranks of a path prepared together (below).

The world (``cpsim.run``) makes them: ``for_ranks`` gives a ``Stage`` for the ranks of a path
whose kernels are all cpsim's, else ``Alone``; either's ``for_rank`` is the preparation of one
rank's run, handed to ``cpsim.paths.run_path``.

One path's inputs for several ranks, prepared together.

The virtual world runs the ranks of a path one after another in one process. Each rank's
kernels read the same batch tensors and tables of the same shapes (filled from its own
allocation), and write an output buffer of the same shape. On an accelerator every
preparation step is a device operation costing more host time than the kernel itself, so
inside a stage they are done once for all the staged ranks: the batch tensors are uploaded
once, the output buffers of all ranks are one allocation, a table is filled for every
rank in four operations, and the arrays that differ by rank (v2's table pointers) go up
for every rank in one copy. Each rank still gets tensors of its own (views into the shared
allocations, laid out exactly as a rank run alone would lay them out, guard rows and
entries included), its own launches, and its own read-back.

A stage is made for a path's ranks only for cpsim's built-in kernels
(``cpsim.run.isolation``): those never write their inputs. A user's kernel gets fresh
inputs per rank run, so whatever it does to them stays within that run. A stage serves
one rank run at a time (``Staged`` tells it which).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpsim.allocator import table_entries
from cpsim.layout import GUARD, POISON
from cpsim.paths import _guard, _intact
from cpsim.paths._inputs import BatchTensors, upload, upload_batch

TABLE_BYTES = 256 << 20  # tables of all staged ranks bigger than this are built per rank run, as without a stage
ALIGN = 256  # bytes: each rank's block starts as a fresh allocation would (Triton specialises on pointer alignment)


class Stage:
    """One path's inputs for the ranks ``allocs`` names (rank -> allocations, per group) of scenario
    ``s``, prepared together; ``for_rank`` hands out one rank's view of them. ``defer``: the ranks'
    outputs wait for ``settle`` to be read back, together."""

    def __init__(self, s, allocs: dict[int, list], device, defer: bool = False):
        self.s = s
        self.allocs = allocs                  # rank -> that rank's allocations, per group
        self.device = torch.device(device)
        self.ranks = sorted(allocs)
        self.rank: int | None = None          # the rank whose run is in progress
        self.defer = defer                    # read the staged ranks' outputs back together (``settle``)
        self._buffers = 0                     # buffers the rank run in progress has asked for
        self._cache: dict = {}
        self._views: dict = {}                # (table key, rank) -> that rank's table view
        self._staged_views: dict = {}         # id(view) -> (view, table key, block shape, rows)
        self._pending: list = []              # (preparation, output) of rank runs not read back yet
        self._unstaged = False                # the rank run in progress got a table built for it alone

    def for_rank(self, rank: int) -> "Staged":
        """The preparation of ``rank``'s run (one of the staged ranks), for the run that starts now."""
        return Staged(self, rank)

    def later(self, inputs: "Staged", out) -> bool:
        """Keep a staged rank run's output to be read back by ``settle``; False when it must be read
        back now (reading back is not deferred, or the run is not one of the staged ranks)."""
        if not self.defer or self.rank is None:
            return False
        self._pending.append((inputs, out))
        return True

    def settle(self) -> None:
        """Read back every deferred output, one copy per shared allocation (the slots and guard
        entries of all staged ranks at once), as ``_guard.read_back`` would one rank's. A fault
        of any rank's kernel surfaces here, unattributed: the caller runs the ranks again one by one."""
        copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def host(t: torch.Tensor) -> torch.Tensor:
            base = t if t._base is None else t._base
            if id(base) not in copies:
                copies[id(base)] = (base, base.cpu())
            b, h = copies[id(base)]
            return h.as_strided(t.shape, t.stride(), h.storage_offset() + t.storage_offset() - b.storage_offset())
        pending, self._pending = self._pending, []
        for inputs, out in pending:
            out.slots, out.guard = _guard.read_back(inputs.watched, len(self.s.groups), out.slots, host)

    def begin(self, rank: int) -> None:
        self.rank, self._buffers, self._unstaged = rank, 0, False

    def batch(self, clamp):
        key = ("batch", clamp)
        if key not in self._cache:
            self._cache[key] = upload_batch(self.s, self.device, clamp)[0]
        return self._cache[key]

    def shared(self, key, make) -> list[torch.Tensor]:
        """``make()``'s arrays, uploaded the first time ``key`` is asked for. The tensors are shared by
        the staged ranks: only cpsim's kernels, which never write their inputs, see them."""
        key = ("shared", key)
        if key not in self._cache:
            self._cache[key] = upload(list(make()), self.device)
        return self._cache[key]

    def per_rank(self, key, make) -> list[torch.Tensor] | None:
        """This rank's tensors of ``make(allocs, peer)``: host arrays that depend on the scenario,
        ``key`` and one rank's allocations (``allocs``) and staged tables alone; ``peer(t)`` is that
        rank's table where this rank has ``t`` (for table pointers). The first time ``key`` is asked
        they are made for every staged rank and uploaded in one copy. None when this rank run got a
        table the stage did not build (too big to stage): the other ranks' tables do not exist yet."""
        if self.rank is None or self._unstaged:
            return None
        key = ("per-rank", key)
        if key not in self._cache:
            made = []
            for r in self.ranks:
                def peer(t, r=r):
                    view = self._peer(t, r)
                    if view is None:
                        raise _NotStaged
                    return view
                try:
                    made.append(list(make(self.allocs[r], peer)))
                except _NotStaged:
                    return None
            n = len(made[0])
            flat = upload([a for arrays in made for a in arrays], self.device)
            self._cache[key] = [flat[k * n:(k + 1) * n] for k in range(len(self.ranks))]
        return self._cache[key][self.ranks.index(self.rank)]

    def _peer(self, table: torch.Tensor, rank: int) -> torch.Tensor | None:
        """Rank ``rank``'s view of the staged table of which ``table`` is this rank's view."""
        found = self._staged_views.get(id(table))
        if found is None or found[0] is not table:
            return None
        _, key, shape, num_rows = found
        if (key, rank) not in self._views:
            block = _guard.block(self._cache[key], self.ranks.index(rank), shape)
            self._remember(key, rank, block[_guard.WIDTH:_guard.WIDTH + num_rows], shape, num_rows)
        return self._views[key, rank]

    def _remember(self, key, rank: int, view: torch.Tensor, shape: tuple[int, int], num_rows: int) -> None:
        self._views[key, rank] = view
        self._staged_views[id(view)] = (view, key, shape, num_rows)

    def buffer(self, groups: list[int], entries: int, dtype, fill: int, width: int) -> torch.Tensor:
        """This rank's [len(groups), entries + 2 * width] block of one allocation for all staged ranks."""
        self._buffers += 1
        shape = (len(groups), entries + 2 * width)
        key = ("buffer", self._buffers, tuple(groups), entries, dtype, fill)
        if key not in self._cache:
            full, _ = _guard.blocks(len(self.ranks), shape, GUARD, dtype, self.device, ALIGN)
            full[:, :shape[0] * shape[1]].view(len(self.ranks), *shape)[:, :, width:width + entries].fill_(fill)
            self._cache[key] = full
        return _guard.block(self._cache[key], self.ranks.index(self.rank), shape)

    def table(self, gi: int, alloc, rows: list[int], num_rows: int, width: int, bpk: int, num_blocks: int,
              block_size: int, entry_size: int) -> torch.Tensor | None:
        """This rank's guarded table (``cpsim.paths._guard.table``), or None when it is not staged
        (too big for all ranks at once, or ``alloc`` is not this rank's)."""
        if self.rank is None or self.allocs[self.rank][gi] is not alloc:
            return None
        cols = max(width, 1) * bpk
        height = num_rows + 2 * _guard.WIDTH
        if len(self.ranks) * height * cols * 4 > TABLE_BYTES:
            self._unstaged = True
            return None
        key = ("table", gi, tuple(rows), num_rows, width, bpk, num_blocks, block_size, entry_size)
        if (key, self.rank) in self._views:
            return self._views[key, self.rank]
        if key not in self._cache:
            entries: dict[int, object] = {}  # replicas share one allocation object: its entries once
            for r in self.ranks:
                a = self.allocs[r][gi]
                if id(a) not in entries:
                    entries[id(a)] = table_entries(a, rows, num_rows, width, bpk)
            self._cache[key] = _guard.tables([entries[id(self.allocs[r][gi])] for r in self.ranks], num_blocks,
                                             block_size, entry_size, self.device, ALIGN)
        table = _guard.block(self._cache[key], self.ranks.index(self.rank), (height, cols))
        self._remember(key, self.rank, table[_guard.WIDTH:_guard.WIDTH + num_rows], (height, cols), num_rows)
        return self._views[key, self.rank]


class _NotStaged(Exception):
    pass


class Alone:
    """The ranks of a path prepared each for its own run alone (``PerRank``): where a kernel is the user's."""

    def __init__(self, s, device):
        self.s, self.device = s, torch.device(device)

    def for_rank(self, rank: int) -> "PerRank":
        return PerRank(self.s, self.device)

    def settle(self) -> None:
        """Nothing waits: every rank run read its outputs back itself."""


def for_ranks(s, allocs: dict[int, list], device, builtin: bool = True, defer: bool = False) -> Stage | Alone:
    """How the world prepares the ranks ``allocs`` names (rank -> allocations) of one path of ``s``:
    together (a ``Stage``) only where every kernel is cpsim's (``builtin``); each alone (``Alone``)
    when any is the user's, the slot-mapping kernel or the replay kernel beside a built-in one.
    ``defer``: the staged ranks' outputs are read back together by ``settle``, which the world calls."""
    return Stage(s, allocs, device, defer) if builtin else Alone(s, device)


@dataclass(frozen=True)
class TableShape:
    """What one group's block table of a path looks like (``allocator.table_entries``'s arguments
    beside the allocation, and the guard id's): the same on every rank."""

    group: int            # which of the scenario's groups
    rows: tuple           # batch entry -> table row
    num_rows: int
    width: int            # entries per row
    bpk: int              # entries per allocated block
    num_blocks: int
    block_size: int
    entry_size: int       # slots per entry


Shared = tuple   # (key, make): ``make()`` gives host arrays that depend on the scenario and ``key`` alone
Own = tuple      # (key, arrays, make): this rank's host ``arrays``; ``make(allocs, peer)`` another rank's


class PerRank:
    """A rank run's inputs made for it alone: every call a fresh upload or allocation."""

    def __init__(self, s, device):
        self.s = s
        self.device = torch.device(device)
        self.launching = "*"  # the group(s) of the launch in progress, named when a kernel raises
        self.written: torch.Tensor | None = None  # entries a user's kernel wrote into its inputs (``count_writes``)
        self.watched: list[tuple[torch.Tensor, list[int]]] = []  # guard-framed buffers handed out, and their groups

    def launch(self, group: str) -> None:
        """Record which group(s) the next launch serves, so a failure can name them."""
        self.launching = group

    def count_writes(self) -> None:
        """From now on, count what the bracketed launches write into their inputs (a user's kernel)."""
        self.written = _intact.counts(len(self.s.groups))

    def bracket(self, inputs: list[tuple[int, str, torch.Tensor]]):
        """Around one launch of a user's kernel (``_intact.bracket``): (group, input name, tensor)."""
        return _intact.bracket(self.written, inputs)

    def batch(self, clamp: int | None = None, shared: Shared | None = None, own: Own | None = None
              ) -> tuple[BatchTensors, list[torch.Tensor]]:
        """(the batch's tensors, ``query_start_loc`` capped at ``clamp``; then ``shared``'s arrays and
        ``own``'s, as tensors), all in one copy."""
        return upload_batch(self.s, self.device, clamp, *(shared[1]() if shared is not None else []),
                            *(own[1] if own is not None else []))

    def shared(self, key, make) -> list[torch.Tensor]:
        """``make()``'s host arrays (the scenario's and ``key``'s alone) on the device."""
        return upload(list(make()), self.device)

    def buffer(self, groups, entries: int, dtype, fill: int = POISON) -> torch.Tensor:
        """[len(groups), entries] of ``fill`` framed by guard entries (``_guard.buffer``), read back after
        the launches."""
        groups = list(groups)
        return self._watch(_guard.buffer(len(groups), entries, dtype, self.device, fill), groups, entries)

    def _watch(self, full: torch.Tensor, groups: list[int], entries: int) -> torch.Tensor:
        self.watched.append((full, groups))
        return full[:, _guard.WIDTH:_guard.WIDTH + entries]

    def table(self, alloc, shape: TableShape) -> torch.Tensor:
        """``_guard.table`` of ``alloc``'s entries in ``shape``."""
        entries = table_entries(alloc, list(shape.rows), shape.num_rows, shape.width, shape.bpk)
        return _guard.table(entries, shape.num_blocks, shape.block_size, shape.entry_size, self.device)

    def read_back(self, out) -> None:
        """``out``'s slots and guard entries on the host, now (one copy per buffer handed out), and the
        entries written into inputs, when counted."""
        out.slots, out.guard = _guard.read_back(self.watched, len(self.s.groups), out.slots)
        out.written = self.written


class Staged(PerRank):
    """One staged rank's inputs: views into what its stage prepared once for all its ranks; what the
    stage does not hold (a table too big to stage) is made for the rank alone, as ``PerRank`` does."""

    def __init__(self, stage: Stage, rank: int):
        super().__init__(stage.s, stage.device)
        self.stage = stage
        stage.begin(rank)

    def batch(self, clamp=None, shared=None, own=None):
        bt = self.stage.batch(clamp)  # uploaded once for every staged rank
        common = self.stage.shared(*shared) if shared is not None else []
        mine = self.stage.per_rank(own[0], own[2]) if own is not None else []
        if mine is None:  # this rank's tables are not staged: its arrays go up for it alone
            mine = upload(list(own[1]), self.device)
        return bt, [*common, *mine]

    def shared(self, key, make):
        return self.stage.shared(key, make)

    def buffer(self, groups, entries, dtype, fill=POISON):
        groups = list(groups)
        return self._watch(self.stage.buffer(groups, entries, dtype, fill, _guard.WIDTH), groups, entries)

    def table(self, alloc, shape):
        staged = self.stage.table(shape.group, alloc, list(shape.rows), shape.num_rows, shape.width, shape.bpk,
                                  shape.num_blocks, shape.block_size, shape.entry_size)
        return staged if staged is not None else super().table(alloc, shape)

    def read_back(self, out):
        if not self.stage.later(self, out):
            super().read_back(out)

"""Guard regions around output buffers and block tables.

A kernel that stores one entry past ``max_num_tokens`` (or before index 0) writes
into memory it does not own; without guards that memory is either another group's
row (the error shows up as a confusing wrong slot) or outside the allocation (silent
corruption, or a crash). Every output row is therefore allocated with ``WIDTH``
entries holding ``GUARD`` before and after it, and the guards are read back after
the rank's launches. Block tables get ``WIDTH`` guard rows above and below, and every
row no request uses holds guard ids too (``layout.table_guard_id``, an id past the
cache), so a kernel that reads outside the rows it serves produces a recognisable slot.

The rank run's preparation (``cpsim.paths.prep``) keeps the buffers it handed out and reads
them back through ``read_back``; nothing here judges the values - the coordinator does,
from the gathered guard entries.
"""

from __future__ import annotations

import numpy as np
import torch

from cpsim.layout import GUARD, POISON, table_guard_id
from cpsim.paths._inputs import upload

WIDTH = 16  # guard entries on each side of an output row and past each table row


def buffer(rows: int, entries: int, dtype: torch.dtype, device, fill: int = POISON) -> torch.Tensor:
    """[rows, entries + 2 * WIDTH]: each row ``entries`` of ``fill`` framed by ``WIDTH`` guard entries.

    Kernels get the view ``[:, WIDTH:WIDTH + entries]``, whose row stride is ``entries + 2 * WIDTH``;
    kernels that take a stride get it from the view, so row ``i``'s overrun lands in its own guard.
    """
    full = torch.full((rows, entries + 2 * WIDTH), GUARD, dtype=dtype, device=device)
    full[:, WIDTH:WIDTH + entries].fill_(fill)
    return full


def table(entries, num_blocks: int, block_size: int, entry_size: int, device) -> torch.Tensor:
    """The int32 table of ``entries`` (``cpsim.allocator.TableEntries``) inside guard rows, with
    every row no request uses holding guard ids too.

    The row stride stays the table's width, as upstream (kernels may bound their loads by the
    stride), so a load past a row's width reaches the next row: a real request's blocks
    (caught as wrong slots by dense-local / matches-reference) or, past the last used
    row, guard ids that ``row-bounds`` names. Filled on ``device`` and written entry by entry:
    the table is mostly null and can be millions of entries wide.
    """
    rows, width = entries.shape
    return block(tables([entries], num_blocks, block_size, entry_size, device), 0, (rows + 2 * WIDTH, width)
                 )[WIDTH:WIDTH + rows]


def tables(entries: list, num_blocks: int, block_size: int, entry_size: int, device, align: int = 1
           ) -> torch.Tensor:
    """[len(entries), per]: one guarded table (``table``) per item of ``entries`` (all of one shape),
    each a [rows + 2 * WIDTH, width] block (``block``) starting ``align`` bytes aligned. Four device
    operations whatever their number: the fill, the used rows' nulls, one upload of the entries, their
    scatter."""
    rows, width = entries[0].shape
    height = rows + 2 * WIDTH
    full, per = blocks(len(entries), (height, width), table_guard_id(num_blocks, block_size, entry_size),
                       torch.int32, device, align)
    grid = full[:, :height * width].view(len(entries), height, width)
    used = entries[0].rows  # the same rows in every item: they depend on the batch, not the allocation
    if used and used == list(range(used[0], used[-1] + 1)):
        grid[:, WIDTH + used[0]:WIDTH + used[-1] + 1] = 0
    elif used:
        grid[:, upload([np.asarray(used, dtype=np.int64) + WIDTH], device)[0]] = 0
    index = np.concatenate([e.index + k * per + WIDTH * width for k, e in enumerate(entries)])
    ids = np.concatenate([e.ids for e in entries])
    if ids.size:
        i, v = upload([index, ids], device)
        full.view(-1).index_put_((i,), v)
    return full


def blocks(count: int, shape: tuple[int, int], fill: int, dtype, device, align: int = 1
           ) -> tuple[torch.Tensor, int]:
    """([count, per] filled with ``fill``, per): one allocation holding ``count`` blocks of ``shape``
    (``block`` reads one), each starting ``align`` bytes aligned."""
    step = max(align // torch.empty((), dtype=dtype).element_size(), 1)
    per = -(-(shape[0] * shape[1]) // step) * step
    return torch.full((count, per), fill, dtype=dtype, device=device), per


def block(full: torch.Tensor, k: int, shape: tuple[int, int]) -> torch.Tensor:
    return full[k, :shape[0] * shape[1]].view(shape)


def read_back(buffers: list[tuple[torch.Tensor, list[int]]], num_groups: int, slots: torch.Tensor, copy=None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(``slots`` on the host, contiguous; [num_groups, 2 * WIDTH] int64 guard entries) after one copy
    per buffer of ``buffers`` (guard-framed buffers, ``buffer``, with the groups of their rows; on an
    accelerator, a rank run's only read-back when its slots are a view of one; ``copy`` maps a buffer
    to its host copy, when a stage has copied it already). The guards are the entries before (first
    WIDTH) and after each group's rows; where several buffers serve one group, an overwritten entry of
    any of them wins."""
    out = np.full((num_groups, 2 * WIDTH), GUARD, dtype=np.int64)
    host_slots = None
    for full, groups in buffers:
        host = full.cpu() if copy is None else copy(full)
        if host_slots is None and _views(slots, full):
            # as_strided's offset counts from the storage's start: on CPU ``host`` is ``full`` itself
            host_slots = host.as_strided(slots.shape, slots.stride(),
                                         host.storage_offset() + slots.storage_offset() - full.storage_offset())
        h = host.numpy()
        frame = np.concatenate([h[:, :WIDTH], h[:, -WIDTH:]], 1).astype(np.int64)
        if len(buffers) == 1 and groups == list(range(num_groups)):
            out = frame  # the usual case: one buffer, a row per group
            continue
        for row, gi in enumerate(groups):
            if 0 <= gi < num_groups:
                hit = frame[row] != GUARD
                out[gi][hit] = frame[row][hit]
    if host_slots is None:
        host_slots = slots.cpu()
    return host_slots.contiguous(), torch.from_numpy(out)


def _views(t: torch.Tensor, full: torch.Tensor) -> bool:
    """``t`` is a view into ``full``'s memory (same storage, same dtype), and ``full`` is contiguous."""
    return (t.dtype == full.dtype and t.device == full.device and full.is_contiguous()
            and t.untyped_storage().data_ptr() == full.untyped_storage().data_ptr()
            and t.storage_offset() >= full.storage_offset())

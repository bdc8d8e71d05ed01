"""Block tables built from their non-null entries, checked against a plain row-by-row construction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpsim.allocator import Allocation, physical_table, table_entries
from cpsim.layout import table_guard_id
from cpsim.paths import _guard


def naive(blocks, rows, num_rows, width, bpk):
    cols = max(width, 1) * bpk
    out = [[0] * cols for _ in range(num_rows)]
    for i, row in enumerate(rows):
        if row < 0 or i >= len(blocks):
            continue
        ids = [int(q) * bpk + k for q in blocks[i][:width] for k in range(bpk)]
        out[row][: len(ids)] = ids
    return out


CASES = [
    ([[5, 9, 2], [7]], [0, 2], 4, 3, 1),
    ([[5, 9, 2], [7]], [3, -1], 4, 2, 4),      # a -1 row, blocks past the width dropped
    ([[11, 12], [], [3, 4, 5, 6]], [1, 0, 2], 3, 4, 2),
    ([[1, 2]], [0], 2, 0, 1),                    # width 0: one null column
    ([], [], 2, 5, 3),
]


@pytest.mark.parametrize("blocks, rows, num_rows, width, bpk", CASES)
def test_table_entries_match_a_row_by_row_table(blocks, rows, num_rows, width, bpk):
    alloc = Allocation(tuple(np.array(b, dtype=np.int64) for b in blocks))
    want = naive(blocks, rows, num_rows, width, bpk)
    if bpk == 1:
        assert physical_table(alloc, rows, num_rows, width).tolist() == want
    e = table_entries(alloc, rows, num_rows, width, bpk)
    table = _guard.table(e, 100, 16, 16 // bpk, "cpu")
    gid = table_guard_id(100, 16, 16 // bpk)
    used = {r for r in rows if r >= 0}
    assert table.dtype == torch.int32 and list(table.shape) == [num_rows, max(width, 1) * bpk]
    for r in range(num_rows):
        assert table[r].tolist() == (want[r] if r in used else [gid] * table.shape[1])
    # The guard rows above and below the table hold the guard id too.
    base = table.storage_offset()
    full = torch.as_strided(table, (num_rows + 2 * _guard.WIDTH, table.shape[1]), table.stride(),
                            base - _guard.WIDTH * table.stride(0))
    assert (full[: _guard.WIDTH] == gid).all() and (full[-_guard.WIDTH:] == gid).all()


def test_ids_past_int32_are_refused():
    alloc = Allocation((np.array([2**31 // 4], dtype=np.int64),))
    table_entries(alloc, [0], 1, 1, 2)  # (2^29) * 2 + 1 fits
    with pytest.raises(OverflowError, match="int32 block table"):
        table_entries(alloc, [0], 1, 1, 4)

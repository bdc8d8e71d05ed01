"""A callable kernel that SIGKILLs the cpsim rank process running it, on one rank, for tests/test_dist.py.

The kernel runs in a worker process its rank started (``cpsim.run.isolation``), so the rank is the
worker's parent. On the rank named by CPSIM_TEST_KILL_RANK (default 1) it kills that parent with
SIGKILL (nothing in the rank can catch it: the peers must name the rank as dead, and rank 0 must
still write its report); on every other rank it is the correct callable kernel.
"""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from callable_abi import slot_mapping as _correct  # noqa: E402


def slot_mapping(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                 cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    if os.environ.get("RANK") == os.environ.get("CPSIM_TEST_KILL_RANK", "1"):
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)  # the worker's watch on its parent ends it
    return _correct(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                    cp_world_size, cp_rank, cp_interleave, is_circular, pad_id)

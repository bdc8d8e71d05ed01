"""A callable kernel that stalls on one rank, for tests of killed and slow ranks under torchrun.

On the rank named by CPSIM_TEST_SLEEPY_RANK (default 1) it writes its PID to
CPSIM_TEST_PID_FILE (when set) and sleeps CPSIM_TEST_SLEEP_S seconds (default 600);
on every other rank it is the correct callable kernel.
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from callable_abi import slot_mapping as _correct  # noqa: E402


def slot_mapping(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                 cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    if os.environ.get("RANK") == os.environ.get("CPSIM_TEST_SLEEPY_RANK", "1"):
        pid_file = os.environ.get("CPSIM_TEST_PID_FILE")
        if pid_file:
            Path(pid_file).write_text(str(os.getpid()))
        time.sleep(float(os.environ.get("CPSIM_TEST_SLEEP_S", "600")))
    return _correct(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                    cp_world_size, cp_rank, cp_interleave, is_circular, pad_id)

"""Callable kernels that leave a process behind in a session of its own, for the reaping tests
(tests/test_pytest_plugin.py, tests/test_hostile_kernel.py, tests/test_isolation.py).

Each call forks a sleeper (300 s) that calls ``setsid()`` (out of the worker's process group) and
appends ``TAG PID`` to the file named by CPSIM_TEST_PIDS; the kernel goes on only once that line is
written, so a test reads every sleeper's pid precisely. Then: ``daemon`` (double fork: the sleeper
is orphaned at once) and ``setsid_child`` return correct slots; ``then_hangs`` never returns;
``then_kills_worker`` SIGKILLs its own worker, so no one ends the sleeper by ancestry;
``wrong_daemon`` is ``daemon`` with every slot PAD.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from callable_abi import slot_mapping as _correct  # noqa: E402


def sleeper(tag: str, double: bool) -> None:
    """Fork the sleeper (``double``: through an intermediate child that exits at once) and return
    once it has written its pid."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setsid()
        if double and os.fork() != 0:
            os._exit(0)
        with open(os.environ["CPSIM_TEST_PIDS"], "a") as f:
            f.write(f"{tag} {os.getpid()}\n")
        os.write(w, b"x")
        os.close(w)
        time.sleep(300)
        os._exit(0)
    os.close(w)
    os.read(r, 1)  # b"" if the child died first: no hang
    os.close(r)
    if double:
        os.waitpid(pid, 0)


def daemon(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
           cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    sleeper("daemon", double=True)
    return _correct(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                    cp_world_size, cp_rank, cp_interleave, is_circular, pad_id)


def setsid_child(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                 cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    sleeper("setsid_child", double=False)
    return _correct(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                    cp_world_size, cp_rank, cp_interleave, is_circular, pad_id)


def then_hangs(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
               cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    sleeper("then_hangs", double=False)
    while True:
        time.sleep(60)


def then_kills_worker(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                      cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    sleeper("then_kills_worker", double=False)
    os.kill(os.getpid(), signal.SIGKILL)


def wrong_daemon(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                 cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    sleeper("wrong_daemon", double=True)
    return torch.full_like(positions, pad_id)


def pids(path, tag: str | None = None) -> list[int]:
    """The sleepers' pids written to ``path`` (those of ``tag`` only, if given)."""
    if not os.path.exists(path):
        return []
    rows = [line.split() for line in open(path).read().splitlines() if line.strip()]
    return [int(r[-1]) for r in rows if tag is None or r[0] == tag]


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie (a killed process not yet reaped by its new parent)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")

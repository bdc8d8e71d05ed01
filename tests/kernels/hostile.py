"""Callable-ABI kernels that misbehave on purpose, for tests/test_isolation.py.

Each one attacks the process that runs it instead of returning slots: cpsim must
turn every one of them into a named violation (exit 1), never exit 0, never hang.
"""

import os
import signal
import sys
import time


def raises(positions, cp_rank):
    raise ValueError(f"boom from cp_rank {cp_rank}")


def segfault(positions):
    os.kill(os.getpid(), signal.SIGSEGV)


def hang(positions):
    while True:
        time.sleep(60)


def sysexit(positions):
    sys.exit(0)


def osexit(positions):
    os._exit(0)

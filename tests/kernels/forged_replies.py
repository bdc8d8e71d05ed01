"""Kernels that write their own "reply" onto their kernel worker's socket, for tests/test_forged_replies.py.

A kernel runs inside cpsim's kernel worker, so it owns that process: it can write any bytes on the
socket the worker answers the judging process through, ahead of the worker's genuine reply. Each
mode below writes one forged frame (``CPSIM_FORGE``), then computes correct slots. cpsim must judge
the rank as a ``kernel-completes`` violation; the ``pickle`` mode's payload would, unpickled by the
judge, write ``CPSIM_FORGE_MARK`` and end the judge with exit 0.

``kernel`` is in the callable ABI; ``ascend_v1`` is vllm-ascend's v1 Triton kernel (tests'
ascend_v1_abi.py) behind a launcher that forges first, for the routes that rerun Triton ABIs only.
"""

import json
import os
import pickle
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ascend_v1_abi import _compute_slot_mapping_kernel  # noqa: E402
from callable_abi import slot_mapping  # noqa: E402


class _Payload:
    """Unpickling it runs code: a marker file, then exit 0 of the unpickling process."""

    def __reduce__(self):
        mark = os.environ.get("CPSIM_FORGE_MARK", "/dev/null")
        return (exec, (f"open({mark!r}, 'w').write('ran in the judge'); import os; os._exit(0)",))


def _cpw1(fields: dict, arrays: list, body: bytes) -> bytes:
    head = json.dumps({"type": "RankDone", "fields": fields, "arrays": arrays}).encode()
    return b"CPW1" + struct.pack("!I", len(head)) + head + body


def _rank_done(rank: int, dtype: str = "int64", path: str = "v1") -> bytes:
    """A well-formed cpsim reply for ``rank``: one group, one all-PAD entry."""
    output = {"slots": {"array": 0}, "enabled": [True], "widths": [1], "entry_sizes": [16],
              "guard": None, "written": None, "output_faults": None}
    return _cpw1({"path": path, "rank": rank, "output": output, "notes": []},
                 [{"dtype": dtype, "shape": [1, 1]}], struct.pack("<q", -1))


def _framed(body: bytes) -> bytes:
    return struct.pack("!i", len(body)) + body  # multiprocessing's framing, which the worker's replies use


def forge(cp_rank: int) -> None:
    mode = os.environ.get("CPSIM_FORGE", "pickle")
    frames = {
        "pickle": lambda: _framed(pickle.dumps(_Payload())),
        "huge-length": lambda: struct.pack("!i", -1) + struct.pack("!Q", 1 << 40),
        "huge-header": lambda: _framed(b"CPW1" + struct.pack("!I", 1 << 31) + b"{}"),
        "wrong-dtype": lambda: _framed(_rank_done(cp_rank, "float64")),
        "another-rank": lambda: _framed(_rank_done(cp_rank + 1)),
        "not-json": lambda: _framed(b"CPW1" + struct.pack("!I", 5) + b"\x80abcd"),
        "truncated": lambda: struct.pack("!i", 1000) + b"CPW1" + b"\0" * 6,
    }
    fd = int(sys.argv[2])  # the worker's socket (cpsim.run.isolation's worker command line)
    os.write(fd, frames[mode]())
    if mode == "truncated":
        time.sleep(600)  # half a reply, then nothing: bounded by --kernel-timeout


def kernel(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
           cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    forge(cp_rank)
    return slot_mapping(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                        cp_world_size, cp_rank, cp_interleave, is_circular, pad_id)


class _ForgingLauncher:
    """Looks like a Triton kernel to cpsim (``arg_names``, ``run``, ``fn``); forges on each launch."""

    def __init__(self, jit):
        self.jit, self.fn, self.arg_names, self.run = jit, jit.fn, jit.arg_names, jit.run

    def __getitem__(self, grid):
        launch = self.jit[grid]

        def forged(*args, **kwargs):
            forge(int(kwargs.get("TOTAL_CP_RANK", 0)))
            return launch(*args, **kwargs)
        return forged


ascend_v1 = _ForgingLauncher(_compute_slot_mapping_kernel)

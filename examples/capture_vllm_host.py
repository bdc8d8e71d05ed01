"""Capture from vLLM's real host classes on a CPU, then judge the capture with ``cpsim replay``.

Run with a side venv's python that has vLLM 0.33.0 (docs/UPSTREAM.md), this tree on PYTHONPATH::

    PYTHONPATH=. /work/venvs/vllm-0.33/bin/python examples/capture_vllm_host.py /tmp/cap [v1|v2] [--break]
    cpsim replay /tmp/cap

It builds one ``MultiGroupBlockTable`` (v1) or MRV2 ``BlockTables`` (v2) per DCP rank, as a
serving process of that rank would, fills them with the block ids the KV manager hands to every
rank, and calls their own ``compute_slot_mapping(s)`` inside ``cpsim.capture.capture`` with the
host targets: each call's tables, live block counts and slot buffers land in ``/tmp/cap/rank<R>.cpcap``.
``--break`` hands rank 1 other positions than the rest (ranks disagree on the batch): replay fails.
"""

import sys

import numpy as np
import torch

from cpsim import capture
from cpsim.stack import vllm as cpu  # the CPU patches of `cpsim run --stack vllm` (docs/UPSTREAM.md)

DCP, INTERLEAVE, MAX_MODEL_LEN, MAX_REQS, MAX_TOKENS = 4, 16, 4096, 8, 256
BLOCK_SIZES = [16, 128]
REQUESTS = [(0, 37), (100, 5), (900, 1), (2000, 64)]  # (computed tokens, scheduled tokens)


def batch(rank: int, broken: bool):
    sched = [n for _, n in REQUESTS]
    qsl = np.concatenate([[0], np.cumsum(sched)]).astype(np.int32)
    pos = np.concatenate([np.arange(c, c + n) for c, n in REQUESTS]).astype(np.int64)
    if broken and rank == 1:
        pos = pos + 1
    return torch.from_numpy(qsl), torch.from_numpy(pos)


def block_ids(rng):
    """Per group, per request: cdiv(len, B x DCP) ids, the same on every rank, never 0 (vLLM's null block)."""
    out = []
    for B in BLOCK_SIZES:
        ids = rng.permutation(np.arange(1, 1024))
        counts = [-(-(c + n) // (B * DCP)) for c, n in REQUESTS]
        at = np.cumsum([0] + counts)
        out.append([ids[at[i]: at[i + 1]].tolist() for i in range(len(REQUESTS))])
    return out


def v1(mod, rank, ids, broken):
    t = mod.v1.MultiGroupBlockTable(max_num_reqs=MAX_REQS, max_num_batched_tokens=MAX_TOKENS, pin_memory=False,
                                    device=torch.device("cpu"), block_sizes=BLOCK_SIZES,
                                    max_num_blocks=[-(-MAX_MODEL_LEN // (B * DCP)) for B in BLOCK_SIZES],
                                    cp_kv_cache_interleave_size=INTERLEAVE)
    for i in range(len(REQUESTS)):
        t.add_row(tuple(g[i] for g in ids), i)
    t.commit_block_table(len(REQUESTS))
    qsl, pos = batch(rank, broken)
    t.compute_slot_mapping(len(REQUESTS), qsl, pos)


def v2(mod, rank, ids, broken):
    width = mod.v1.get_block_table_width
    t = mod.v2.BlockTables(block_sizes=BLOCK_SIZES, max_num_reqs=MAX_REQS, max_num_batched_tokens=MAX_TOKENS,
                           max_num_blocks_per_group=[width(-(-MAX_MODEL_LEN // (B * DCP)), B) for B in BLOCK_SIZES],
                           device=torch.device("cpu"), cp_size=DCP, cp_rank=rank, cp_interleave=INTERLEAVE)
    for i in range(len(REQUESTS)):
        t.append_block_ids(i, tuple(g[i] for g in ids), overwrite=True)
    t.apply_staged_writes()
    qsl, pos = batch(rank, broken)
    t.compute_slot_mappings(torch.arange(len(REQUESTS), dtype=torch.int32), qsl, pos, int(qsl[-1]))


def main(out: str, path: str, broken: bool) -> None:
    _, mod = cpu.load(None)
    ids = block_ids(np.random.default_rng(7))
    with capture.capture(out, capture.KNOWN_HOSTS, meta={"max_model_len": MAX_MODEL_LEN, "num_blocks": 1024}):
        for rank in range(DCP):
            mod.v1.get_dcp_group = lambda: cpu._Group(DCP, rank)
            mod.v1.get_pcp_group = lambda: cpu._Group(1, 0)
            (v1 if path == "v1" else v2)(mod, rank, ids, broken)
    print(f"captured {path} of {mod.version} for {DCP} ranks into {out}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(args[0], args[1] if len(args) > 1 else "v1", "--break" in sys.argv)

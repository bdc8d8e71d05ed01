"""The named scenarios (``--scenario NAME``): each one a batch and cache layout a bug or an upstream
feature needs, with CP sizes that command-line flags can override.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from cpsim.errors import ConfigError
from cpsim.scenario import Batch, CPConfig, KVGroup, Limits, Request, Scenario, max_blocks_needed


def _mixed_batch(rng: np.random.Generator, spec: int, max_model_len: int) -> list[Request]:
    reqs = [Request(0, 700, "prefill"), Request(1500, 300, "chunked")]
    reqs += [Request(int(rng.integers(1, max_model_len - 8)), 1, "decode") for _ in range(6)]
    reqs += [Request(int(rng.integers(1, max_model_len - 8)), 1 + spec, "spec") for _ in range(3)]
    reqs.append(Request(0, 5, "prefill-short"))
    return reqs


def preset(name: str, dcp: int | None = None, pcp: int | None = None,
           interleave: int | None = None, seed: int = 0) -> Scenario:
    """Named scenarios; CP flags override the preset's own CP config."""
    rng = np.random.default_rng(seed)
    if name == "default":
        cp = CPConfig(dcp=8, pcp=1, interleave=16)
        groups = (KVGroup("attn-hybrid", "attention", 128, 64, num_blocks=2048),
                  KVGroup("attn-b16", "attention", 16, num_blocks=8192),
                  KVGroup("mamba", "mamba", 128, num_blocks=2048, cp_sharded=False))
        limits = Limits(max_model_len=4096, max_num_reqs=16, max_num_batched_tokens=2048,
                        num_speculative_tokens=2)
        reqs = _mixed_batch(rng, 2, limits.max_model_len)
        # v2 rows: a shuffled permutation, one dummy request at the end.
        reqs.append(Request(0, 0, "dummy"))
        rows = [int(x) for x in rng.permutation(limits.max_num_reqs)[: len(reqs) - 1]] + [-1]
        batch = Batch(tuple(reqs), tuple(rows), num_tokens_padded=sum(r.num_tokens for r in reqs) + 37)
    elif name == "decode-heavy":
        cp = CPConfig(dcp=8, interleave=1)
        groups = (KVGroup("attn", "attention", 128, num_blocks=8192),)
        limits = Limits(max_model_len=32768, max_num_reqs=256, max_num_batched_tokens=256)
        reqs = tuple(Request(int(rng.integers(0, 32000)), 1, "decode") for _ in range(256))
        batch = Batch(reqs, tuple(int(x) for x in rng.permutation(256)))
    elif name == "long-prefill":
        cp = CPConfig(dcp=8, interleave=128)
        groups = (KVGroup("attn", "attention", 128, num_blocks=1024),)
        limits = Limits(max_model_len=131072, max_num_reqs=4, max_num_batched_tokens=131072)
        batch = Batch((Request(0, 131072, "prefill"),))
    elif name == "hybrid-mamba":
        cp = CPConfig(dcp=4, interleave=64)
        groups = (KVGroup("attn", "attention", 256, 128, num_blocks=1024),
                  KVGroup("swa", "sliding_window", 64, cp_sharded=False, num_blocks=256),
                  KVGroup("attn-local", "attention", 64, cp_sharded=False, num_blocks=2048),
                  KVGroup("mamba", "mamba", 256, cp_sharded=False, num_blocks=1024))
        limits = Limits(max_model_len=16384, max_num_reqs=8, max_num_batched_tokens=4096)
        reqs = (Request(0, 1000, "prefill"), Request(3000, 512, "chunked"),
                Request(9000, 1, "decode"), Request(40, 1, "decode"), Request(0, 30, "prefill-short"))
        batch = Batch(reqs, (3, 0, 6, 1, 5), num_tokens_padded=1600)
    elif name == "mtp":
        # vllm-ascend #14024: DCP 4, 5 speculative tokens, 12 requests, 80 batched tokens.
        cp = CPConfig(dcp=4, interleave=1)
        groups = (KVGroup("attn", "attention", 128, num_blocks=1024),)
        limits = Limits(max_model_len=8192, max_num_reqs=12, max_num_batched_tokens=80,
                        num_speculative_tokens=5)
        reqs = [Request(int(rng.integers(100, 8000)), 6, "spec") for _ in range(12)]
        reqs[0] = Request(0, 44, "prefill")
        batch = Batch(tuple(reqs))
    elif name == "partial-replica":
        # Upstream MRV2 today: per-group CP sizes in one launch (8 = sharded, 4 = two replicas
        # of a 4-way shard, 1 = replicated), hybrid kernel blocks, spec decode whose rejected
        # drafts are padded (is_padding), a dummy request and graph padding.
        cp = CPConfig(dcp=8, pcp=1, interleave=16)
        groups = (KVGroup("attn-cp8", "attention", 128, 64, num_blocks=2048),
                  KVGroup("attn-cp4", "attention", 64, 32, num_blocks=4096, cp_size=4),
                  KVGroup("attn-cp1", "attention", 16, num_blocks=8192, cp_size=1),
                  KVGroup("mamba", "mamba", 128, num_blocks=2048, cp_sharded=False))
        limits = Limits(max_model_len=4096, max_num_reqs=16, max_num_batched_tokens=2048,
                        num_speculative_tokens=3)
        reqs = [Request(0, 700, "prefill"), Request(1500, 300, "chunked")]
        reqs += [Request(int(rng.integers(1, limits.max_model_len - 8)), 1, "decode") for _ in range(5)]
        reqs += [Request(int(rng.integers(1, limits.max_model_len - 8)), 4, "spec", padded_drafts=d)
                 for d in (0, 1, 2, 3)]
        reqs.append(Request(0, 0, "dummy"))
        rows = [int(x) for x in rng.permutation(limits.max_num_reqs)[: len(reqs) - 1]] + [-1]
        total = sum(r.num_tokens for r in reqs)
        # one more padding token inside the chunked prefill, by index
        batch = Batch(tuple(reqs), tuple(rows), num_tokens_padded=total + 29, is_padding=(700 + 299,))
    elif name == "prefix-replay":
        # SWA bounded replay (vLLM #56227): after a prefix hit ending at H the last window [H - W, H) is
        # re-run to rebuild the sliding-window group, which left prefix caching; every prefix-cacheable
        # group pads those positions so the shared cached blocks are not rewritten.
        cp = CPConfig(dcp=2, pcp=2, interleave=16)
        W = 128
        groups = (KVGroup("mla", "attention", 128, 64, num_blocks=1024),
                  KVGroup("indexer", "attention", 64, num_blocks=2048, cp_size=2),
                  KVGroup("swa", "sliding_window", W, cp_sharded=False, num_blocks=64,
                          prefix_cacheable=False, prefix_replay_tokens=W),
                  KVGroup("kpool-tail", "attention", 16, num_blocks=4096, cp_size=1, prefix_cacheable=False))
        limits = Limits(max_model_len=4096, max_num_reqs=12, max_num_batched_tokens=1024)
        reqs = [Request(896, 300, "replay", replay_start=896),              # the whole window, then new tokens
                Request(1664, 100, "replay-chunk", replay_start=1600),      # second chunk: 64 replayed
                Request(3000, 50, "replay-inside", replay_start=3000),      # ends inside the window
                Request(0, 200, "prefill")]
        reqs += [Request(int(rng.integers(1, limits.max_model_len - 8)), 1, "decode") for _ in range(4)]
        reqs.append(Request(0, 0, "dummy"))
        rows = [int(x) for x in rng.permutation(limits.max_num_reqs)[: len(reqs) - 1]] + [-1]
        batch = Batch(tuple(reqs), tuple(rows), num_tokens_padded=sum(r.num_tokens for r in reqs) + 11)
    elif name == "hybrid-interleave":
        # vLLM #51031 / vllm-ascend #10442: the interleave above the kernel block, I = B = 128 > b = 64 at
        # DCP 2, and I = 128 > b = 32 under B = 256 (cpsim's global rule keeps I a divisor of every sharded B). Owners and rank-local offsets
        # follow virtual blocks of B x N positions; built from b x N they collapse onto rank 0.
        cp = CPConfig(dcp=2, interleave=128)
        groups = (KVGroup("attn-hybrid", "attention", 128, 64, num_blocks=1024),
                  KVGroup("attn-b256", "attention", 256, 32, num_blocks=1024))
        limits = Limits(max_model_len=16384, max_num_reqs=8, max_num_batched_tokens=1024)
        reqs = (Request(0, 300, "prefill"), Request(1000, 200, "chunked"),
                Request(int(rng.integers(256, 16000)), 1, "decode"), Request(130, 1, "decode"))
        batch = Batch(reqs, (2, 0, 5, 1))
    elif name == "long-context":
        # vllm-ascend #7575 / #13155 (a fixed 4096-entry table window): decodes whose table index is past
        # 4096, i.e. positions past 4096 x B x N (B 16, DCP 2: 131072), in a 256K-context model.
        cp = CPConfig(dcp=2, interleave=16)
        groups = (KVGroup("attn-b16", "attention", 16, num_blocks=32768),)
        limits = Limits(max_model_len=262144, max_num_reqs=4, max_num_batched_tokens=64)
        reqs = (Request(4096 * 16 * 2, 1, "decode"), Request(int(rng.integers(140000, 262000)), 1, "decode"),
                Request(2000, 1, "decode"))
        batch = Batch(reqs, (1, 3, 0))
    elif name == "huge-cache":
        # Block ids past 2^24 (vllm-ascend #13048: ids through float32) and slots past 2^31 (vLLM #1486,
        # vLLM 0.33.0's MRV2 block x block size in int32). The caches are simulated sparsely: only the
        # ids handed out exist (cpsim.allocator), so 2^26 blocks cost what 16 do.
        cp = CPConfig(dcp=2, interleave=16)
        groups = (KVGroup("attn-b16", "attention", 16, num_blocks=2**26),          # 2^30 slots, ids to 2^26
                  KVGroup("attn-b128", "attention", 128, 64, num_blocks=2**25))     # 2^32 slots: past int32
        limits = Limits(max_model_len=8192, max_num_reqs=4, max_num_batched_tokens=256)
        reqs = (Request(0, 40, "prefill"), Request(int(rng.integers(1, 8000)), 1, "decode"),
                Request(int(rng.integers(1, 8000)), 1, "decode"))
        batch = Batch(reqs, (2, 0, 3))
    elif name == "released-window":
        # What vLLM releases run for a sliding-window layer: a slot-mapped table replicated on every rank
        # (not cpsim's ring), next to a DCP-sharded group (vLLM #57260: the DCP transform applied to the
        # replicated group), with the batch graph-padded to a capture size (vLLM #36580 / vllm-ascend #11774).
        cp = CPConfig(dcp=2, interleave=1)
        groups = (KVGroup("attn", "attention", 128, num_blocks=1024),
                  KVGroup("swa-replicated", "attention", 128, num_blocks=2048, cp_size=1))
        limits = Limits(max_model_len=8192, max_num_reqs=8, max_num_batched_tokens=512)
        reqs = (Request(0, 200, "prefill"), Request(int(rng.integers(1, 8000)), 1, "decode"),
                Request(int(rng.integers(1, 8000)), 1, "decode"), Request(3000, 40, "chunked"))
        batch = Batch(reqs, (0, 4, 1, 2), num_tokens_padded=256)
    elif name == "graph-padding":
        # vLLM 0.33.0 / 0.34.0 MRV2 speculator (spec_decode/speculator.py `_copy_request_inputs`): rows past the
        # real requests of a CUDA-graph-padded draft batch get idx_mapping -1 and still schedule tokens (a
        # uniform 1 + num_speculative_tokens each, stale positions); the kernel pads them (`is_real_req`).
        cp = CPConfig(dcp=4, interleave=16)
        groups = (KVGroup("attn", "attention", 128, 64, num_blocks=1024),
                  KVGroup("attn-replicated", "attention", 64, num_blocks=2048, cp_size=1))
        limits = Limits(max_model_len=4096, max_num_reqs=8, max_num_batched_tokens=512, num_speculative_tokens=3)
        reqs = (Request(0, 200, "prefill"), Request(1000, 100, "chunked"), Request(3000, 4, "spec", padded_drafts=2),
                Request(int(rng.integers(1, 4000)), 1, "decode"), Request(0, 4, "dummy"), Request(1700, 4, "dummy"))
        batch = Batch(reqs, (5, 2, 7, 0, -1, -1), num_tokens_padded=320)
    elif name == "tail-group":
        # A one-block tail group (vLLM's KpoolTailSpec, slot-mapped by the generic kernel until vLLM #56380; in
        # no release cpsim has read, so only cpsim's profile expresses it): positions past its row's 16 are
        # PAD, and the row's end is never read.
        cp = CPConfig(dcp=4, interleave=16)
        groups = (KVGroup("attn", "attention", 128, 64, num_blocks=1024),
                  KVGroup("tail", "attention", 16, num_blocks=64, cp_size=1, row_blocks=1))
        limits = Limits(max_model_len=4096, max_num_reqs=8, max_num_batched_tokens=512)
        reqs = (Request(0, 200, "prefill"), Request(1000, 100, "chunked"),
                Request(int(rng.integers(1, 4000)), 1, "decode"))
        batch = Batch(reqs, (2, 0, 1), num_tokens_padded=320)
    else:
        raise ConfigError("scenario", f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    s = Scenario(name, cp, groups, limits, batch, seed=seed)
    over = {k: v for k, v in (("dcp", dcp), ("pcp", pcp), ("interleave", interleave)) if v is not None}
    if over:
        s = s.replace(cp=dataclasses.replace(s.cp, **over))
    if min(s.cp.dcp, s.cp.pcp, s.cp.interleave) < 1:
        return s  # validate() names the bad field
    # An overridden world size keeps each group CP size a divisor of it.
    s = s.replace(groups=tuple(dataclasses.replace(g, cp_size=math.gcd(g.cp_size, s.cp.world))
                               if g.cp_size and s.cp.world % g.cp_size else g for g in s.groups))
    # A smaller CP size puts more blocks on each rank: grow the cache to fit.
    groups = []
    for g in s.groups:
        need = max_blocks_needed(s, g) + 1
        groups.append(g if need <= g.num_blocks else dataclasses.replace(g, num_blocks=1 << (need - 1).bit_length()))
    return s.replace(groups=tuple(groups))


PRESETS = ("default", "decode-heavy", "long-prefill", "hybrid-mamba", "mtp", "partial-replica", "prefix-replay",
           "hybrid-interleave", "long-context", "huge-cache", "released-window", "graph-padding", "tail-group")

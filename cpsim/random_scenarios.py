"""Valid scenarios drawn from a seed: small enough for the interpreter, for tests, sweeps and the fuzzer.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cpsim.scenario import Batch, CPConfig, KVGroup, Limits, Request, Scenario, max_blocks_needed, validate


def random_replay(rng: np.random.Generator, groups: list[KVGroup], reqs: list[Request], chance: float,
                  kinds: tuple[str, ...] = ("chunked",)) -> tuple[list[KVGroup], list[Request]]:
    """With probability ``chance``: one slot-mapped group leaves prefix caching with a replay window, and
    requests of ``kinds`` that do not start at 0 replay from a start their chunk lies in (often the chunk's
    own first position, as the replay's first chunk). Draws come from ``rng`` alone, so a caller's other
    draws do not move."""
    mapped = [i for i, g in enumerate(groups) if g.slot_mapped]
    if not mapped or rng.random() >= chance:
        return groups, reqs
    w = int(rng.choice([1, 4, 16, 128]))
    gi = int(rng.choice(mapped))
    groups = [dataclasses.replace(g, prefix_cacheable=False, prefix_replay_tokens=w) if i == gi else g
              for i, g in enumerate(groups)]
    out = []
    for r in reqs:
        if r.kind in kinds and r.context_len >= 1 and not r.padded_drafts and rng.random() < 0.7:
            start = r.context_len if rng.random() < 0.5 else int(rng.integers(max(1, r.context_len - w + 1),
                                                                                r.context_len + 1))
            r = dataclasses.replace(r, replay_start=start)
        out.append(r)
    return groups, out


def random_scenario(seed: int, max_world: int = 8, max_groups: int = 4, max_reqs: int = 12,
                    max_model_len: int = 65536, upstream_features: float = 0.3) -> Scenario:
    """A valid random scenario, small enough for the interpreter (used by tests and sweeps).

    With probability ``upstream_features`` each sharded group gets a random group CP size
    (a divisor of the world size) and each spec request some padded drafts, plus a few
    is_padding tokens. Those draws come from a second generator, so the rest of a seed's
    scenario is what it was before these features existed.
    """
    rng = np.random.default_rng(seed)
    extra = np.random.default_rng([seed, 0x13])
    world = int(rng.integers(1, max_world + 1))
    dcp = world
    pcp = 1
    if world > 1 and world % 2 == 0 and rng.random() < 0.3:
        pcp, dcp = 2, world // 2
    groups = []
    interleave = int(2 ** rng.integers(0, 6))
    for gi in range(int(rng.integers(1, max_groups + 1))):
        kind = rng.choice(["attention", "attention", "attention", "sliding_window", "mamba"])
        bpk = int(2 ** rng.integers(0, 4))
        b = int(2 ** rng.integers(3, 8))
        B = b * bpk
        sharded = kind == "attention" and bool(rng.random() < 0.85)
        if kind == "sliding_window":
            B, b, sharded = b, 0, False
        groups.append(KVGroup(f"g{gi}-{kind}", str(kind), B, b if bpk > 1 else 0, sharded, num_blocks=1))
    # Interleave must divide every sharded group's block size.
    for g in groups:
        if g.world(CPConfig(dcp, pcp)) > 1:
            while g.block_size % interleave:
                interleave //= 2
    cp = CPConfig(dcp, pcp, interleave)
    mml = int(rng.integers(64, max_model_len + 1))
    spec = int(rng.integers(0, 4))
    nreq = int(rng.integers(1, max_reqs + 1))
    reqs = []
    for _ in range(nreq):
        mode = rng.choice(["decode", "prefill", "chunked", "spec", "empty"])
        if mode == "decode":
            q = 1
        elif mode == "spec":
            q = 1 + max(spec, 1)
        elif mode == "empty":
            q = 0
        else:
            q = int(rng.integers(1, min(mml, 600) + 1))
        ctx = 0 if mode == "prefill" else int(rng.integers(0, mml - q + 1))
        reqs.append(Request(ctx, q, str(mode)))
    total = sum(r.num_tokens for r in reqs)
    limits = Limits(max_model_len=mml, max_num_reqs=nreq + int(rng.integers(0, 4)),
                    max_num_batched_tokens=max(total, 1) + int(rng.integers(0, 64)),
                    num_speculative_tokens=spec)
    rows = [int(x) for x in rng.permutation(limits.max_num_reqs)[:nreq]]
    for i, r in enumerate(reqs):
        if r.num_tokens == 0 and rng.random() < 0.5:
            rows[i] = -1
    padded = 0
    if rng.random() < 0.5:
        padded = int(rng.integers(total, limits.slot_buffer_size + 1))
    world = cp.world
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    groups = [dataclasses.replace(g, cp_size=int(extra.choice(divisors)))
              if g.world(cp) > 1 and extra.random() < upstream_features else g for g in groups]
    reqs = [dataclasses.replace(r, padded_drafts=int(extra.integers(1, r.num_tokens)))
            if r.kind == "spec" and r.num_tokens > 1 and extra.random() < upstream_features else r for r in reqs]
    flagged: tuple[int, ...] = ()
    if total and extra.random() < upstream_features / 2:
        flagged = tuple(sorted(int(t) for t in extra.choice(total, size=min(total, 3), replace=False)))
    groups, reqs = random_replay(np.random.default_rng([seed, 0x5e]), groups, reqs, upstream_features)
    batch = Batch(tuple(reqs), tuple(rows), padded, flagged)
    s = Scenario(f"random-{seed}", cp, tuple(groups), limits, batch, seed=seed)
    sized = tuple(dataclasses.replace(g, num_blocks=max_blocks_needed(s, g) + 1 + int(rng.integers(0, 64)))
                  for g in s.groups)
    return validate(s.replace(groups=sized))

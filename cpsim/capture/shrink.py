"""Shrink a failing explicit step: drop requests, tokens, groups and tail entries while it still fails.

A candidate keeps a subset of the scheduled tokens (the same token indices on
every rank), a subset of the groups and a shorter padding tail. Given outputs
move with their tokens: every invariant judges a token by its own position,
request and table row, so a kept token's verdict does not depend on dropped
ones. With a kernel, each candidate's inputs are rerun through it instead and
its fresh outputs are kept. A candidate is accepted while the target invariant
(the first one reported) still fails. Greedy chunk removal (halves, quarters,
... single items), repeated until nothing more can go.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cpsim.capture.batch import ExplicitStep, RankBatch
from cpsim.capture.steps import check_step
from cpsim.errors import ConfigError


def subset(step: ExplicitStep, keep: np.ndarray, groups: list[int], tail: int) -> ExplicitStep:
    """The step restricted to scheduled tokens ``keep`` (sorted indices), ``groups`` and ``tail`` padding entries."""
    ranks = []
    for rb in step.ranks:
        n = rb.num_scheduled
        req = np.repeat(np.arange(rb.num_reqs), np.diff(rb.query_start_loc))
        counts = np.bincount(req[keep], minlength=rb.num_reqs)
        live = counts > 0
        qsl = np.concatenate([[0], np.cumsum(counts[live])]).astype(np.int64)
        pad_tail = min(max(rb.num_tokens_padded - n, 0), tail)
        pos = np.concatenate([rb.positions[keep], rb.positions[n: n + pad_tail],
                              np.zeros(max(tail - pad_tail, 0), dtype=np.int64)])
        slots = None
        if rb.slots is not None:
            s = rb.slots[groups]
            slots = np.concatenate([s[:, keep[keep < s.shape[1]]], s[:, n: n + tail]], axis=1)
        ranks.append(RankBatch(pos, qsl, rb.idx_mapping[live], len(keep) + pad_tail,
                               [rb.tables[g] for g in groups], slots,
                               None if rb.is_padding is None else rb.is_padding[keep],
                               None if rb.num_blocks is None else [rb.num_blocks[g] for g in groups],
                               None if rb.replay_start is None else rb.replay_start[live]))
    limits = step.limits
    entries = len(keep) + tail
    if limits.slot_buffer_size != entries:
        limits = dataclasses.replace(limits, max_num_batched_tokens=entries, num_speculative_tokens=0)
    return ExplicitStep(step.path, step.cp, tuple(step.groups[g] for g in groups),
                        tuple(step.entry_sizes[g] for g in groups), limits, ranks, dict(step.label))


def compact_tables(step: ExplicitStep) -> ExplicitStep:
    """Keep only the table rows the requests use (renumbered in order)."""
    ranks = []
    for rb in step.ranks:
        used = sorted({int(i) for i in rb.idx_mapping if i >= 0})
        remap = {old: new for new, old in enumerate(used)}
        idx = np.array([remap.get(int(i), -1) for i in rb.idx_mapping], dtype=np.int64)
        tables = [None if t is None else t[used] if used else t[:1] for t in rb.tables]
        live = None if rb.num_blocks is None else [  # live counts are per table row: they follow the rows
            None if nb is None else nb[used] if used else nb[:1] for nb in rb.num_blocks]
        ranks.append(dataclasses.replace(rb, idx_mapping=idx, tables=tables, num_blocks=live))
    return dataclasses.replace(step, ranks=ranks)


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i: i + size]


def shrink(step: ExplicitStep, kernels: dict | None = None, target: str | None = None, max_checks: int = 2000,
           runner=None):
    """(smallest failing step, its outcome). ``target``: the invariant that must keep failing; ``runner``:
    the reruns' (``cpsim.capture.rerun.run``)."""
    rb0 = step.ranks[0]
    if any(rb.own_tokens(gi) is not None for rb in step.ranks for gi in range(len(step.groups))):
        raise ConfigError("--shrink", "a step whose groups have their own positions (g<G>/positions) cannot be "
                                      "shrunk yet")
    n = rb0.num_scheduled
    tail_max = max((rb.slots.shape[1] - n) if rb.slots is not None else 0 for rb in step.ranks)
    state = {"keep": np.arange(n), "groups": list(range(len(step.groups))), "tail": tail_max}
    budget = [max_checks]
    k = (kernels or {}).get(step.path)
    rerun = k is not None

    def build(keep, groups, tail):
        cand = compact_tables(subset(step, keep, groups, tail))
        if rerun:  # fresh outputs of the kernel on the smaller inputs
            from cpsim.capture import rerun as rr
            slots = rr.run(cand, None if k == "builtin" else k, runner=runner)
            cand = dataclasses.replace(cand, ranks=[dataclasses.replace(rb, slots=s)
                                                    for rb, s in zip(cand.ranks, slots)])
        return cand

    def fails(keep, groups, tail):
        if budget[0] <= 0 or not groups:
            return None
        budget[0] -= 1
        from cpsim.run.isolation import KernelFailed
        try:
            out = check_step(build(keep, groups, tail), None)
        except (ConfigError, KernelFailed):  # a candidate the kernel does not complete on is not kept
            return None
        if not out.failed or (target and target not in out.invariants()):
            return None
        return out

    best = fails(state["keep"], state["groups"], state["tail"])
    if best is None:
        raise ConfigError("--shrink", "the step does not fail on its own (nothing to shrink)")
    changed = True
    while changed and budget[0] > 0:
        changed = False
        # requests first (big steps), then tokens, groups, tail
        req = np.repeat(np.arange(rb0.num_reqs), np.diff(rb0.query_start_loc))
        live = sorted(set(req[state["keep"]].tolist()))
        size = max(len(live) // 2, 1)
        while size >= 1:
            for chunk in list(_chunks(live, size)):
                keep = state["keep"][~np.isin(req[state["keep"]], chunk)]
                if len(keep) == 0:
                    continue
                out = fails(keep, state["groups"], state["tail"])
                if out is not None:
                    state["keep"], best, changed = keep, out, True
                    live = [x for x in live if x not in chunk]
            size //= 2
        size = max(len(state["keep"]) // 2, 1)
        while size >= 1:
            idx = list(range(len(state["keep"])))
            for chunk in list(_chunks(idx, size)):
                mask = np.ones(len(state["keep"]), dtype=bool)
                mask[[i for i in chunk if i < len(mask)]] = False
                keep = state["keep"][mask]
                if len(keep) == 0 or len(keep) == len(state["keep"]):
                    continue
                out = fails(keep, state["groups"], state["tail"])
                if out is not None:
                    state["keep"], best, changed = keep, out, True
                    break
            else:
                size //= 2
        for g in list(state["groups"]):
            groups = [x for x in state["groups"] if x != g]
            out = fails(state["keep"], groups, state["tail"])
            if out is not None:
                state["groups"], best, changed = groups, out, True
        for tail in (0, state["tail"] // 4, state["tail"] // 2):
            if tail < state["tail"]:
                out = fails(state["keep"], state["groups"], tail)
                if out is not None:
                    state["tail"], best, changed = tail, out, True
                    break
    small = best.step
    small.label = dict(small.label) | {"shrunk_from": {"requests": rb0.num_reqs, "tokens": n,
                                                       "groups": len(step.groups)}}
    return small, best

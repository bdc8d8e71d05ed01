"""The scenario space the fuzzer searches, written once against one primitive.

``build(d, ...)`` takes every decision through ``d.integer(lo, hi)`` (plus ``d.sub``,
which only groups draws), so one definition serves two drivers:

* ``HypothesisDraw``: each ``integer`` is one Hypothesis choice, so Hypothesis can draw
  the space (``--explore hypothesis``) and always shrinks in it.
* ``RandomDraw``: ``random.Random``, about 0.1 ms a scenario where Hypothesis spends about
  2 ms, recording the offsets it chose. Hypothesis replays such a record choice for
  choice and lands on the same scenario, so a failure the random explorer finds (the default,
  ``cpsim.fuzz.explore``) is handed to Hypothesis' shrinker as it stands.

Choices shrink toward their lower bound, so the space is written with the simple option
first: the first kind in a list, the small branch of a range, "no more elements", "no
padding", the natural row order.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from typing import Callable

from cpsim import scenario as sc
from cpsim.random_scenarios import random_replay

MAX_TABLE_ENTRIES = 1 << 22      # int32 entries per group table (16 MiB): bounds max_model_len
MAX_MODEL_LEN = 1 << 24
MAX_MODEL_LEN_INVALID = 1 << 20  # invalid layouts count blocks by scanning positions
INT32_MAX = sc.INT32_MAX
DEFAULT_SLOT_LIMIT = 1 << 31
DEFAULT_BLOCK_ID_LIMIT = 1 << 26
EXACT_FLOAT32_IDS = 1 << 24      # integers up to 2^24 are exact in float32

GROUP_CHOICES = ("attention", "attention-unsharded", "sliding_window", "mamba")
REQUEST_KINDS = ("decode", "prefill", "chunked", "spec", "empty")
POW2 = tuple(1 << i for i in range(13))


def cache_cap(g: sc.KVGroup, space: str, int32_slots: bool = False) -> int:
    """Most physical blocks a group's cache may have in ``space``.

    "default": kernel-block ids below 2^26 and slot ids below 2^31; where every kernel under test
    writes int64 slots (``int32_slots`` false: cpsim's own kernels, every released vLLM ABI) a cache
    may also hold 2^24 kernel blocks whatever its block size, so kernel blocks of more than 128 tokens
    reach slot ids past 2^31 (up to 2^36), where an int32 product wraps. Those ids stay exact in
    float32, so a float32 id bug never needs such a cache and the ``slot>=2^31`` dimension stays the
    int32 one's. An ABI that writes int32 slots (vllm-ascend's) cannot express a slot past 2^31 - 1:
    for it the default keeps every slot id below 2^31. "extreme": up to 2^31 - 1 kernel blocks.
    Only the ids handed out are materialised (``cpsim.allocator``), so a cap costs no memory.
    """
    if space == "extreme":
        return INT32_MAX // g.bpk
    cap = DEFAULT_SLOT_LIMIT // g.block_size
    if not int32_slots:
        cap = max(cap, EXACT_FLOAT32_IDS // g.bpk)
    return min(cap, DEFAULT_BLOCK_ID_LIMIT // g.bpk)


# ---- drivers -------------------------------------------------------------------------

class RandomDraw:
    """Plain pseudo-random choices, recorded in ``choices`` the way ``HypothesisDraw`` reads them
    (offsets from the lower bound), for Hypothesis to replay.

    Bounds and their neighbours come up often, as in Hypothesis, and half the draws over a
    range of more than 16 values are log-uniform, so small values stay common (and repeat: on a
    device each new constexpr set is a compile) next to the space's own branches.
    """

    def __init__(self, rng: random.Random, prefix: list[int] | tuple[int, ...] = ()):
        self.rng = rng
        self.prefix = prefix  # offsets to replay first (an earlier scenario's), where they still fit
        self.choices: list[int] = []

    def integer(self, lo: int, hi: int) -> int:
        span = hi - lo
        i = len(self.choices)
        if span <= 0:
            v = lo
        elif i < len(self.prefix) and self.prefix[i] <= span:
            v = lo + self.prefix[i]
        else:
            r = self.rng.random()
            if span > 127 and r < 6 / 128:
                v = (lo, lo, lo + 1, hi - 1, hi, hi)[int(r * 128)]
            elif span > 15 and r < 0.5:
                v = lo + min(span, self.rng.getrandbits(self.rng.randint(1, span.bit_length())))
            else:
                v = self.rng.randint(lo, hi)
        self.choices.append(v - lo)
        return v

    def sub(self, fn: Callable, *args):
        return fn(self, *args)


class HypothesisDraw:
    """Each ``integer`` is one Hypothesis integer choice; each ``sub`` one span (the shrinker
    deletes and reorders spans whole, e.g. a request).

    The choice is an offset in ``[0, 2^k)``, ``k`` the bit length of the range's size, folded
    into the range, rather than a value in ``[lo, hi]``: bounds that depend on earlier choices
    (a request's room below max_model_len, a cache's smallest size) then rarely change the
    choice's own bounds when the shrinker lowers an earlier one, so the choices after it still
    mean what they meant (Hypothesis calls a replay whose values fall outside their new bounds
    misaligned, and mostly throws it away). Offsets Hypothesis draws at the top end go to ``hi``.
    """

    def __init__(self, draw):
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        n = max(hi - lo, 0) + 1
        top = (1 << n.bit_length()) - 1
        v = self.draw(_offsets(top))
        if v >= n:
            v = n - 1 if v >= top - 1 else v % n
        return lo + v

    def sub(self, fn: Callable, *args):
        return self.draw(strategy(fn, *args))


@functools.cache
def _st():
    from hypothesis import strategies as st
    return st


@functools.cache
def _offsets(top: int):
    # Built once per bound: Hypothesis validates a new strategy object on its first draw.
    return _st().integers(0, top)


@functools.lru_cache(maxsize=8192)
def strategy(fn: Callable, *args):
    """``fn(d, *args)`` as a Hypothesis strategy (one object per argument tuple)."""
    import types

    # st.composite labels a strategy's spans by a hash of its definition's code. One shared closure
    # would give every span the same label; a constant naming ``fn`` in each copy of the code gives
    # every kind of span (a group, a request, an optional element) its own, which the shrinker's
    # passes compare.
    def definition(draw):
        return fn(HypothesisDraw(draw), *args)

    code = definition.__code__.replace(co_consts=definition.__code__.co_consts + (fn.__qualname__,))
    named = types.FunctionType(code, definition.__globals__, fn.__name__, None, definition.__closure__)
    return _st().composite(named)()


# ---- combinators (every one of them shrinks toward its first option) -------------------

def pick(d, options):
    return options[d.integer(0, len(options) - 1)]


def ranges(d, *bounds: tuple[int, int]) -> int:
    lo, hi = bounds[d.integer(0, len(bounds) - 1)]
    return d.integer(lo, hi)


def small_or(d, lo: int, small: int, hi: int) -> int:
    """Mostly small values (cheap to interpret, quick to shrink), sometimes anything up to ``hi``."""
    small = min(small, hi)
    return ranges(d, (lo, max(lo, small // 2)), (lo, small), (lo, hi))


def flag(d) -> bool:
    return d.integer(0, 1) == 1


def many(d, lo: int, hi: int, fn: Callable, *args) -> list:
    """``lo`` to ``hi`` elements. Each optional one is drawn with its "more" flag in one span, as
    Hypothesis' own lists do, so deleting that span removes the element and keeps the rest aligned."""
    out = [d.sub(fn, *args) for _ in range(lo)]
    while len(out) < hi:
        x = d.sub(_maybe, fn, *args)
        if x is None:
            break
        out.append(x)
    return out


def _maybe(d, fn: Callable, *args):
    return d.sub(fn, *args) if flag(d) else None


def distinct(d, n: int, k: int) -> list[int]:
    """``k`` distinct values of ``range(n)`` (a partial Fisher-Yates: the identity when shrunk)."""
    order = list(range(n))
    for i in range(k):
        j = d.integer(i, n - 1)
        order[i], order[j] = order[j], order[i]
    return order[:k]


def divisors(n: int) -> list[int]:
    return [x for x in range(1, n + 1) if n % x == 0]


# ---- the space --------------------------------------------------------------------------

def group(d) -> sc.KVGroup:
    """A group; its num_blocks is drawn last, once the batch says how many blocks it needs."""
    kind = pick(d, GROUP_CHOICES)
    bpk = 1 if kind in ("sliding_window", "mamba") else small_or(d, 1, 4, 16)
    b_max = 4096 // bpk
    # Mostly powers of two, sometimes any size (mostly small): on a device every new block size is a
    # new constexpr set, compiled once per CP rank.
    b = pick(d, [p for p in POW2 if p <= b_max]) if d.integer(0, 3) < 3 else small_or(d, 1, 64, b_max)
    return sc.KVGroup(kind, "attention" if kind.startswith("attention") else kind, b * bpk,
                      b if bpk > 1 else 0, kind == "attention", num_blocks=2)


def request(d, mml: int, spec: int, max_tokens_per_request: int) -> sc.Request:
    kind = pick(d, REQUEST_KINDS)
    q = {"decode": 1, "spec": 1 + spec, "empty": 0}.get(kind)
    if q is None:
        q = small_or(d, 1, 4, max_tokens_per_request)
    q = min(q, mml)
    room = mml - q
    # Few tokens, but anywhere up to max_model_len (or right below it): big positions are cheap.
    ctx = 0 if kind == "prefill" else ranges(d, (0, room), (max(0, room - 16), room))
    # Rejected / excess drafts of a spec request are padding (shrinks to none).
    padded_drafts = d.integer(0, q - 1) if kind == "spec" and q > 1 else 0
    return sc.Request(ctx, q, kind, padded_drafts)


def build(d, allow_invalid: bool = False, max_programs: int = 48, max_tokens_per_request: int = 24,
          max_world: int = 16, space: str = "default", int32_slots: bool = False) -> sc.Scenario:
    """A scenario ``scenario.validate`` accepts (unless ``allow_invalid`` draws a broken CP layout).

    ``max_programs`` bounds world x groups x (requests + 1), the interpreter programs one path
    launches; large worlds get fewer requests. ``space`` and ``int32_slots`` (a kernel under test writes
    int32 slots) decide the cache sizes only (``cache_cap``).
    """
    world = small_or(d, 1, 4, max_world)
    pcp = pick(d, divisors(world))
    drawn = many(d, 1, small_or(d, 1, 2, 5), group)
    groups = [dataclasses.replace(g, name=f"g{i}-{g.name}") for i, g in enumerate(drawn)]
    # Interleave: a divisor of every CP-sharded block size (the global rule), or anything when allowed.
    sharded_b = [g.block_size for g in groups if world > 1 and g.cp_sharded and g.kind == "attention"]
    common = math.gcd(*sharded_b) if sharded_b else max(g.block_size for g in groups)
    invalid = allow_invalid and flag(d)
    # I = B (the largest choice) is common in deployments and is where I > b bites with hybrid blocks.
    if invalid:
        interleave = d.integer(1, 2 * max(g.block_size for g in groups))
    else:
        interleave = common if flag(d) else pick(d, divisors(common))
    cp = sc.CPConfig(dcp=world // pcp, pcp=pcp, interleave=interleave)
    # A CP size per sharded group: 0 (the world size, where shrinking goes) or any divisor.
    groups = [dataclasses.replace(g, cp_size=pick(d, (0, *divisors(world))))
              if g.cp_sharded and g.kind == "attention" and world > 1 else g for g in groups]

    budget_reqs = max(1, min(64, max_programs // (world * len(groups)) - 1))
    spec = small_or(d, 0, 2, 6)
    extra_rows = small_or(d, 0, 2, 16)
    # Table memory bounds max_model_len (v1 tables of unsharded groups are N times wider).
    rows = budget_reqs + extra_rows
    cap = min(max(1, MAX_TABLE_ENTRIES // (rows * g.bpk * world)) * g.block_size for g in groups)
    cap = min(cap, MAX_MODEL_LEN_INVALID if invalid else MAX_MODEL_LEN)
    branch = d.integer(0, 2)  # small, anything, exactly the cap
    mml = cap if branch == 2 else d.integer(1, min(256, cap) if branch == 0 else cap)
    reqs = many(d, 1, small_or(d, 1, 3, budget_reqs), request, mml, spec, max_tokens_per_request)
    nreq = len(reqs)
    max_num_reqs = nreq + extra_rows
    total = sum(r.num_tokens for r in reqs)
    draft = max(spec - 1, 0) * max_num_reqs
    # Batched-token limit from "draft slots nearly full" to some slack.
    mnbt = d.integer(max(1, total - draft), total + 64)
    limits = sc.Limits(mml, max_num_reqs, mnbt, spec)
    idx: tuple = ()
    if flag(d):  # rows out of order, and requests without a row (dummies; with tokens: graph-padding rows)
        perm = distinct(d, max_num_reqs, nreq)
        idx = tuple(-1 if dummy(d, r) else x for r, x in zip(reqs, perm))
    padded = d.integer(total, limits.slot_buffer_size) if flag(d) else 0
    flagged: set[int] = set()
    while total and len(flagged) < min(total, 3) and flag(d):
        flagged.add(d.integer(0, total - 1))
    s = sc.Scenario("fuzz", cp, tuple(groups), limits, sc.Batch(tuple(reqs), idx, padded, tuple(sorted(flagged))),
                    seed=d.integer(0, 2**16), allow_invalid=invalid)
    s = with_slot_buffer_dtype(with_tail(with_replay(s)))
    int32_slots = int32_slots or s.limits.slot_buffer_dtype == "int32"
    return sc.validate(s.replace(groups=cache_sizes(d, s, space, int32_slots)))


def with_tail(s: sc.Scenario) -> sc.Scenario:
    """Tail groups from the scenario's own seed, not from the draws: an unsharded attention group becomes,
    three times in ten, a group whose rows hold one or two blocks (vLLM's KpoolTailSpec, SPEC §2.4).
    Shrinking the seed (or the groups) removes it."""
    import numpy as np
    rng = np.random.default_rng([s.seed, 0x7a])
    groups = tuple(dataclasses.replace(g, row_blocks=int(rng.integers(1, 3)))
                   if g.kind == "attention" and g.world(s.cp) == 1 and rng.random() < 0.3 else g for g in s.groups)
    return s.replace(groups=groups)


def with_slot_buffer_dtype(s: sc.Scenario) -> sc.Scenario:
    """The host's slot buffer from the scenario's own seed, not from the draws: one scenario in five hands the
    kernel under test an int32 or an int64 buffer whatever its ABI writes (vLLM hosts allocate int64,
    vllm-ascend's int32), so a store that depends on the buffer's dtype shows. An int32 buffer keeps the
    caches' slots below 2^31 (``cache_cap``): a correct kernel never wraps there. Shrinking the seed removes it."""
    import numpy as np
    rng = np.random.default_rng([s.seed, 0xd7])
    if rng.random() >= 0.2:
        return s
    dtype = ("int32", "int64")[int(rng.integers(0, 2))]
    return s.replace(limits=dataclasses.replace(s.limits, slot_buffer_dtype=dtype))


def dummy(d, r: sc.Request) -> bool:
    """Request ``r`` gets no table row (idx_mapping -1): half the empty ones, a quarter of the others, whose
    tokens are then a graph-padding row's (vLLM 0.33.0 MRV2 speculator: padded rows keep their tokens, PAD)."""
    return flag(d) if r.num_tokens == 0 else d.integer(0, 3) == 3


def with_replay(s: sc.Scenario) -> sc.Scenario:
    """Prefix-cache replay from the scenario's own seed, not from the draws: half the scenarios get a
    group that left prefix caching with a replay window and requests whose chunk starts in it.
    Shrinking the seed (or the groups and requests) removes the replay."""
    import numpy as np
    groups, reqs = random_replay(np.random.default_rng([s.seed, 0x5e]), list(s.groups), list(s.batch.requests),
                                    0.5, kinds=("chunked", "decode"))
    reqs = [dataclasses.replace(r, replay_start=0) if s.batch.is_dummy(i) else r for i, r in enumerate(reqs)]
    return s.replace(groups=tuple(groups), batch=dataclasses.replace(s.batch, requests=tuple(reqs)))


def cache_sizes(d, s: sc.Scenario, space: str, int32_slots: bool = False) -> tuple[sc.KVGroup, ...]:
    """Each group's num_blocks: a few spare blocks, or a big sparse cache up to the space's cap.

    The shrinker lowers the branch first and then the size, so a cache moves down to the
    smallest failing size (no boundary constant survives a shrink: from "near the cap" it moves
    to "anything" and on down). The near-the-cap branches make caches with ids past 2^24 common
    wherever the space allows them, whichever driver draws.
    """
    out = []
    for g in s.groups:
        need = max(2, sc.max_blocks_needed(s, g) + 1)
        cap = max(need, cache_cap(g, space, int32_slots))
        branch = d.integer(0, 3)
        if branch < 2:
            n = d.integer(need, min(need + 64, cap) if branch == 0 else cap)
        else:  # twice: half the caches are big, counted down from the cap (small draws stay big)
            n = cap - d.integer(0, cap - max(need, cap // 16))
        out.append(dataclasses.replace(g, num_blocks=n))
    return tuple(out)

"""Searching at device speed: plain random scenarios, each new signature shrunk by Hypothesis.

On a GPU a scenario's kernels take microseconds and its host work a few milliseconds, while a
Hypothesis draw costs about two milliseconds (its engine keeps a tree of every choice made). So here the
scenarios come from the same space (``space.build``) through ``space.RandomDraw``, and only
the failures go through Hypothesis: the choices that drew a failing scenario are handed over
as an entry of the example database's secondary corpus, which Hypothesis replays choice for
choice (the same scenario) and then shrinks as if it had found it itself.

The entry goes to the secondary corpus, not the primary: Hypothesis takes a primary entry
that still fails exactly as given for an already shrunk example and would skip shrinking.
"""

from __future__ import annotations

import random
import time

from cpsim.fuzz import rounds, space

SHRINK_EVERY = 1000   # explored scenarios between shrink rounds (and after the last)
MAX_REDRAWS = 50      # duplicate draws in a row before the space counts as exhausted
RECENT = 64           # scenarios whose choices later ones may start with


def prefix(rng: random.Random, recent: dict[int, list[int]]) -> list[int]:
    """Half the scenarios start with the first choices of a recent one (a random cut), as
    Hypothesis' mutations do: the CP layout and groups come first in the space, so such a
    scenario often keeps an earlier one's configuration and draws a new batch. On a device that
    is the difference between reusing compiled kernels and compiling new constexpr sets."""
    if not recent or rng.random() < 0.5:
        return []
    earlier = recent[rng.choice(list(recent))]
    return earlier[: rng.randint(0, len(earlier))]


def seed_database(seeds: list[bytes], backing=None):
    """An example database whose secondary corpus is ``seeds``; whatever Hypothesis saves (the
    shrunk examples) goes to ``backing``, so a later run starts from them."""
    from hypothesis.database import ExampleDatabase

    class SeedDatabase(ExampleDatabase):
        def fetch(self, key: bytes):
            if key.endswith(b".secondary"):
                yield from seeds

        def save(self, key: bytes, value: bytes) -> None:
            if backing is not None and not key.endswith(b".secondary"):
                backing.save(key, value)

        def delete(self, key: bytes, value: bytes) -> None:
            if backing is not None and not key.endswith(b".secondary"):
                backing.delete(key, value)

    return SeedDatabase()


def encode(choices: list[int]) -> bytes:
    """A database entry: Hypothesis' own serialisation of a choice sequence. ``choices_to_bytes``
    is a module function of ``hypothesis.database``, not documented API (pyproject asks for
    Hypothesis >= 6.168, the oldest version it was run with); tests/test_fuzz.py replays such
    entries and fails if the format ever stops round-tripping."""
    from hypothesis.database import choices_to_bytes
    return choices_to_bytes(choices)


def explore(me) -> None:
    """(``me``: a job's ``cpsim.fuzz._Searcher``.) Draw, run and classify until the budget (examples or minutes) is spent; shrink each new
    signature with Hypothesis every ``SHRINK_EVERY`` scenarios and at the end."""
    from hypothesis import Phase

    cfg = me.cfg
    stream = None if cfg.seed is None else cfg.seed + cfg.seed_stream * rounds.SEED_STRIDE
    rng = random.Random(stream)
    # With --seed the run is a function of the seed: no database read or written (as Hypothesis does when seeded).
    strategy, db = rounds.strategy_of(cfg), (rounds.database_of(cfg) if stream is None else None)
    deadline = time.monotonic() + cfg.minutes * 60 if cfg.minutes else None
    seeds: dict[str, bytes] = {}   # signature -> the choices of the first scenario that showed it
    if db is not None:  # failures an earlier run shrank and saved: replayed (not shrunk again) first
        me.prog.phase = "replay database"
        rounds.hypothesis_round(me, strategy, db, 1, [Phase.reuse], None)

    def shrink() -> None:
        # A scenario showing two signatures raises the earlier one; the other is raised (and shrunk)
        # in the next round, once the first is done. A round that shrinks nothing ends it.
        for _ in range(len(seeds) + 1):
            pending = [x for x in me.live(seeds) if x in seeds]
            if not pending:
                return
            me.prog.phase = "shrink"
            before = len(me.done)
            # No Hypothesis seed here: a seeded Hypothesis run reads no database, so it would not see the
            # entries. The scenarios explored still follow --seed; the shrinker's few random passes do not.
            rounds.hypothesis_round(me, strategy, seed_database([seeds[x] for x in pending], db),
                                len(pending), [Phase.reuse, Phase.shrink], None)
            if len(me.done) == before:
                break
        for x in me.live(seeds):
            if x in seeds:
                me.done.add(x)  # not replayed as recorded: kept as the smallest failure seen

    recent: dict[int, list[int]] = {}
    redraws = since_shrink = 0
    drawn = None  # the next (draw, scenario), drawn while the last one's kernels were running

    narrow = cfg.int32_slots()

    def draw():
        d = space.RandomDraw(rng, prefix(rng, recent))
        return d, space.build(d, cfg.allow_invalid, cfg.max_programs, cfg.max_tokens_per_request, space=cfg.space,
                              int32_slots=narrow)

    def start_next(current: str) -> None:
        # Called while a scenario's kernels run in the kernel worker: the next scenario is drawn and
        # its kernels queued behind them, so the worker goes on to it while this one is checked.
        # Drawn here in every mode (in-process too), so a seed draws the same scenarios whether or
        # not the kernels run ahead.
        nonlocal drawn
        if deadline is None and me.prog.examples >= cfg.max_examples:
            return
        drawn = draw()
        fp = drawn[1].fingerprint()
        if fp not in me.seen and fp != current:
            me.ahead(drawn[1])

    while redraws < MAX_REDRAWS:
        if deadline is None and me.prog.examples >= cfg.max_examples:
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        me.prog.phase = "search"
        (d, s), drawn = drawn or draw(), None
        if s.fingerprint() in me.seen:
            redraws += 1
            continue
        redraws = 0
        since_shrink += 1
        recent[since_shrink % RECENT] = d.choices
        sigs = me.visit(s, lambda fp=s.fingerprint(): start_next(fp)) or {}
        for x in sigs:
            seeds.setdefault(x, encode(d.choices))
        if cfg.stop_after_first and me.reported():
            break
        if since_shrink >= SHRINK_EVERY:
            shrink()
            since_shrink = 0
    shrink()

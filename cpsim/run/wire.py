"""What a kernel worker sends back to the judging process: plain data, never pickle.

The worker imports and runs the kernel under test, so everything it writes on its socket may be
the kernel's own bytes. Unpickling them would run the kernel's code in the judge (a ``__reduce__``
payload can exit 0 or patch the oracle). So a reply is a frame of plain data:

    b"CPW1" | header length (4 bytes, big-endian) | JSON header | int64 numbers (the machine's order)

The header names one message type of this module and its fields, with the sizes of the arrays it
holds; the arrays' numbers follow the header in the order of the fields (every array a reply
carries is int64: slots, guard entries, input-write counts). ``decode`` accepts only the types
below, only their fields, and only sizes that add up to the numbers sent, with nothing after them;
anything else raises ``Malformed``, which the
parent turns into a ``kernel-completes`` violation on the rank it was waiting for. A worker taken
over by its kernel can still send a well-formed reply with its own rank's slots: those are judged
like any other output. It cannot run code here, and cannot answer for a rank it was not asked
(``RankDone`` names its path and rank, and the parent checks both).

The parent's requests to the worker stay pickled: the worker trusts its parent.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable

import numpy as np

MAGIC = b"CPW1"
_LEN = struct.Struct("!I")
MAX_HEADER = 1 << 20          # bytes of JSON in one reply
MAX_REPLY = 1 << 30           # bytes of one reply, header and arrays together
MAX_TEXT = 16384              # characters of one string field
MAX_LIST = 1 << 16            # items of one list field


class Malformed(Exception):
    """A reply that is not one of this module's messages, well formed."""


# ---- the messages -------------------------------------------------------------------------------

@dataclass
class Ready:
    """The worker has prepared its device (``prepare``)."""


@dataclass
class RankOutputData:
    """One rank's ``RankOutput`` as arrays and lists (``cpsim.paths.RankOutput`` holds tensors)."""

    slots: np.ndarray                       # [groups, entries] int64
    enabled: list[bool]
    widths: list[int]
    entry_sizes: list[int]
    guard: np.ndarray | None = None         # [groups, 2 * guard width] int64
    written: np.ndarray | None = None       # [groups, inputs] int64
    output_faults: list[int] | None = None


@dataclass
class RankDone:
    """A rank run that completed: its output (None where the path produced none) and the kernel's notes."""

    path: str
    rank: int
    output: RankOutputData | None
    notes: list[str] = field(default_factory=list)


@dataclass
class Batch:
    """Every rank of a chunk of cpsim's own kernels, in rank order, in one message."""

    replies: list


@dataclass
class Refused:
    """The run's input was refused (a ``ConfigError`` in the worker): exit 2 in the parent."""

    field: str
    rule: str


@dataclass
class Unloaded:
    """The kernel's import (or lookup) raised, exited or failed in the worker."""

    kind: str
    message: str


@dataclass
class Raised:
    """The rank run raised ``name`` (``text``: its first line and where); ``group``: the group launching."""

    name: str
    text: str
    group: str = "*"


@dataclass
class Exited:
    """The rank run called ``sys.exit(code)`` (``code`` as its repr)."""

    code: str
    group: str = "*"


@dataclass
class LostOnReadback:
    """A batched chunk's outputs raised when they were read back (a device fault)."""

    name: str
    text: str


@dataclass
class SignatureRead:
    """A kernel's signature, read where it was imported (``cpsim.kernels.under_test.Signature``)."""

    name: str
    triton: bool
    is_callable: bool
    params: list[tuple[str, bool]]
    origin: str = ""
    release: str = ""           # the release its file is of, where its folder says so


@dataclass
class Value:
    """A ``call``'s result: its integer arrays (``many``: it returned a tuple of them), and the kernel's notes."""

    arrays: list[np.ndarray]
    many: bool = False
    notes: list[str] = field(default_factory=list)


# The parent's own readings of a worker that did not answer (never sent by a worker).
@dataclass
class Timeout:
    """No reply within the bound."""


@dataclass
class Dead:
    """The worker ended (or closed its socket) before a whole reply came."""


@dataclass
class Garbled:
    """The worker sent something that is not a well-formed reply (``why``)."""

    why: str


MESSAGES = MappingProxyType({c.__name__: c for c in (Ready, RankDone, Batch, Refused, Unloaded, Raised, Exited,
                                                     LostOnReadback, SignatureRead, Value)})
LOAD_KINDS = ("raised", "exited", "timeout", "crashed")
_HEADER = frozenset({"type", "fields"})
_RANK_DONE = frozenset({"path", "rank", "output", "notes"})
_OUTPUT = frozenset({"groups", "entries", "guard", "written", "faults"})


# ---- encoding (the worker's side) ---------------------------------------------------------------
#
# Every number a reply carries is an int64 (slots, guard and input-write counts, a group's flags and
# widths): they travel as one int64 body, read in order. The JSON header says how many each field
# takes; lists of a group's numbers travel in the body too, so a batch of eight ranks is one JSON
# parse and one ``frombuffer``, not dozens of validated lists.

def encode(msg) -> bytes:
    """One message as a frame."""
    numbers: list[np.ndarray] = []
    head = json.dumps({"type": type(msg).__name__, "fields": _fields(msg, numbers)},
                      separators=(",", ":")).encode()
    body = np.concatenate([a.ravel() for a in numbers]) if numbers else np.zeros(0, np.int64)
    return b"".join([MAGIC, _LEN.pack(len(head)), head, body.astype(np.int64, copy=False).tobytes()])


def _fields(msg, numbers: list) -> dict:
    if isinstance(msg, Batch):
        return {"replies": [{"type": type(r).__name__, "fields": _fields(r, numbers)} for r in msg.replies]}
    if isinstance(msg, RankDone):
        return {"path": msg.path, "rank": msg.rank, "notes": msg.notes,
                "output": None if msg.output is None else _output_fields(msg.output, numbers)}
    if isinstance(msg, Value):
        numbers += [np.asarray(a, dtype=np.int64) for a in msg.arrays]
        return {"shapes": [list(a.shape) for a in msg.arrays], "many": msg.many, "notes": msg.notes}
    if isinstance(msg, SignatureRead):
        return {**msg.__dict__, "params": [list(p) for p in msg.params]}
    return dict(msg.__dict__)


def _output_fields(o: RankOutputData, numbers: list) -> dict:
    groups, entries = o.slots.shape
    per_group = [o.enabled, o.widths, o.entry_sizes] + ([] if o.output_faults is None else [o.output_faults])
    numbers += [np.asarray(per_group, np.int64).reshape(len(per_group), groups), o.slots]
    for extra in (o.guard, o.written):
        if extra is not None:
            numbers.append(extra)
    return {"groups": groups, "entries": entries,
            "guard": -1 if o.guard is None else o.guard.shape[1],
            "written": -1 if o.written is None else o.written.shape[1], "faults": o.output_faults is not None}


# ---- decoding (the judge's side) ----------------------------------------------------------------

def decode(frame: bytes | bytearray) -> object:
    """The message in ``frame``; ``Malformed`` naming the first thing wrong with it. The arrays it
    holds are views of ``frame`` (writable when ``frame`` is a bytearray)."""
    if len(frame) > MAX_REPLY:
        raise Malformed(f"a reply of {len(frame)} bytes (at most {MAX_REPLY})")
    if frame[:4] != MAGIC:
        raise Malformed("a reply that does not start with cpsim's frame marker (pickle or other bytes)")
    if len(frame) < 8:
        raise Malformed("a reply cut off in its header")
    (n,) = _LEN.unpack_from(frame, 4)
    if n > MAX_HEADER or 8 + n > len(frame):
        raise Malformed(f"a header of {n} bytes in a reply of {len(frame)}")
    try:
        header = json.loads(bytes(frame[8:8 + n]))
    except (UnicodeDecodeError, ValueError) as e:
        raise Malformed(f"a header that is not JSON ({e})") from None
    if (len(frame) - 8 - n) % 8:
        raise Malformed(f"a body of {len(frame) - 8 - n} bytes, not whole int64 numbers")
    numbers = _Numbers(np.frombuffer(frame, dtype=np.int64, offset=8 + n))
    _keys(header, _HEADER, "the header")
    msg = _message(header, numbers)
    if numbers.at != len(numbers.all):
        raise Malformed(f"{len(numbers.all) - numbers.at} numbers no field takes")
    return msg


class _Numbers:
    """The body's int64 numbers, taken in order."""

    def __init__(self, all_: np.ndarray):
        self.all, self.at = all_, 0

    def take(self, shape: tuple[int, ...], where: str) -> np.ndarray:
        count = 1
        for d in shape:
            count *= d
        if self.at + count > len(self.all):
            raise Malformed(f"{where} needs {count} numbers, {len(self.all) - self.at} left in the reply")
        got = self.all[self.at:self.at + count].reshape(shape)
        self.at += count
        return got


def _keys(d, allowed: frozenset | set, where: str) -> None:
    if not isinstance(d, dict):
        raise Malformed(f"{where} is not an object")
    if d.keys() != allowed:
        extra, missing = set(d) - allowed, allowed - set(d)
        raise Malformed(f"{where} has fields {sorted(map(str, extra))[:5]} it should not have"
                        if extra else f"{where} lacks {sorted(missing)}")


def _message(header, numbers: _Numbers):
    kind = header.get("type") if isinstance(header, dict) else None
    if kind not in MESSAGES:
        raise Malformed(f"a message of unknown type {str(kind)[:40]!r}")
    f = header["fields"]
    if kind == "RankDone":
        _keys(f, _RANK_DONE, "RankDone")
        out = None if f["output"] is None else _output(f["output"], numbers)
        return RankDone(_text(f["path"], "path"), _int(f["rank"], "rank"), out, _texts(f["notes"], "notes"))
    if kind == "Batch":
        _keys(f, {"replies"}, "Batch")
        replies = f["replies"]
        if not isinstance(replies, list) or len(replies) > MAX_LIST:
            raise Malformed("Batch.replies is not a list")
        for i, r in enumerate(replies):
            _keys(r, _HEADER, "Batch.replies[]")
            if r["type"] == "Batch":
                raise Malformed("a Batch inside a Batch")
        return Batch([_message(r, numbers) for r in replies])
    if kind == "Value":
        _keys(f, {"shapes", "many", "notes"}, "Value")
        shapes = f["shapes"]
        if not isinstance(shapes, list) or not 1 <= len(shapes) <= 16:
            raise Malformed("Value.shapes is not a list of 1 to 16 shapes")
        return Value([numbers.take(_shape(s, "Value.shapes[]"), "Value") for s in shapes],
                     _bool(f["many"], "Value.many"), _texts(f["notes"], "notes"))
    if kind == "SignatureRead":
        _keys(f, {"name", "triton", "is_callable", "params", "origin", "release"}, kind)
        params = f["params"]
        if not isinstance(params, list) or len(params) > 1024 or not all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[1], bool) for p in params):
            raise Malformed("SignatureRead.params is not a list of [name, has_default]")
        return SignatureRead(_text(f["name"], "name"), _bool(f["triton"], "triton"),
                             _bool(f["is_callable"], "is_callable"),
                             [(_text(n, "params"), d) for n, d in params], _text(f["origin"], "origin"),
                             _text(f["release"], "release"))
    return _plain_message(kind, f)


def _plain_message(kind: str, f):
    """The messages of strings only."""
    cls = MESSAGES[kind]
    names = {"Ready": (), "Refused": ("field", "rule"), "Unloaded": ("kind", "message"),
             "Raised": ("name", "text", "group"), "Exited": ("code", "group"),
             "LostOnReadback": ("name", "text")}[kind]
    _keys(f, set(names), kind)
    if kind == "Unloaded" and f["kind"] not in LOAD_KINDS:
        raise Malformed(f"Unloaded.kind {str(f['kind'])[:40]!r}")
    return cls(*(_text(f[n], f"{kind}.{n}") for n in names))


def _output(f, numbers: _Numbers) -> RankOutputData:
    _keys(f, _OUTPUT, "output")
    groups, entries = _int(f["groups"], "output.groups"), _int(f["entries"], "output.entries")
    guard, written = _int(f["guard"], "output.guard"), _int(f["written"], "output.written")
    if not (0 <= groups <= MAX_LIST and 0 <= entries <= MAX_REPLY and -1 <= guard <= MAX_LIST
            and -1 <= written <= MAX_LIST) or not isinstance(f["faults"], bool):
        raise Malformed(f"output sizes {groups}, {entries}, {guard}, {written} out of range")
    per_group = numbers.take((4 if f["faults"] else 3, groups), "output's per-group numbers").tolist()
    enabled = per_group[0]
    if not all(e == 0 or e == 1 for e in enabled):
        raise Malformed("output.enabled is not 0 or 1 for every group")
    slots = numbers.take((groups, entries), "output.slots")
    g = None if guard < 0 else numbers.take((groups, guard), "output.guard")
    w = None if written < 0 else numbers.take((groups, written), "output.written")
    return RankOutputData(slots, [e == 1 for e in enabled], per_group[1], per_group[2], g, w,
                          per_group[3] if f["faults"] else None)


def _shape(v, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > 4 or not all(type(d) is int and 0 <= d <= MAX_REPLY for d in v):
        raise Malformed(f"{where} is not up to 4 sizes, each >= 0")
    return tuple(v)


def _text(v, where: str) -> str:
    if not isinstance(v, str) or len(v) > MAX_TEXT:
        raise Malformed(f"{where} is not a string of at most {MAX_TEXT} characters")
    return v


def _texts(v, where: str) -> list[str]:
    if not isinstance(v, list) or len(v) > MAX_LIST:
        raise Malformed(f"{where} is not a list")
    return [_text(x, where) for x in v]


def _int(v, where: str) -> int:
    if type(v) is not int:
        raise Malformed(f"{where} is not an integer")
    return v


def _bool(v, where: str) -> bool:
    if not isinstance(v, bool):
        raise Malformed(f"{where} is not true or false")
    return v


# ---- reading a frame (the judge's side) ---------------------------------------------------------

_MP_LEN = struct.Struct("!i")   # ``multiprocessing.connection``'s framing, which ``send_bytes`` writes
_MP_LONG = struct.Struct("!Q")


def read_frame(fd: int, timeout: float, ended: Callable[[], bool], pidfd: int | None = None) -> bytearray:
    """One whole message from the socket ``fd`` (the worker's ``send_bytes`` framing), within
    ``timeout`` seconds. ``TimeoutError`` when it does not come whole in time (a kernel that wrote half
    a reply and sleeps), ``EOFError`` when the worker ends first (``ended``; ``pidfd`` becomes
    readable then: a process the kernel forked may hold the socket open after the worker died),
    ``Malformed`` when the length is past ``MAX_REPLY``. Never blocks past the deadline, and never
    allocates more than the length allows."""
    reader = _Reader(fd, time.monotonic() + timeout, ended, pidfd)
    (n,) = _MP_LEN.unpack(reader.exactly(_MP_LEN.size))
    if n == -1:
        (n,) = _MP_LONG.unpack(reader.exactly(_MP_LONG.size))
    if not 0 <= n <= MAX_REPLY:
        raise Malformed(f"a reply announcing {n} bytes (at most {MAX_REPLY})")
    return reader.exactly(n)


class _Reader:
    def __init__(self, fd: int, deadline: float, ended: Callable[[], bool], pidfd: int | None):
        self.fd, self.deadline, self.ended, self.pidfd = fd, deadline, ended, pidfd
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN)
        if pidfd is not None:
            self.poller.register(pidfd, select.POLLIN)

    def exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got, fd = memoryview(buf), 0, self.fd
        while got < n:
            left = self.deadline - time.monotonic()
            # Without a pidfd the worker's end is looked for every 0.2 s.
            wait = max(0.0, left if self.pidfd is not None else min(left, 0.2))
            fds = {f for f, _ in self.poller.poll(int(wait * 1000))}
            if fd not in fds:
                if (self.pidfd in fds or self.ended()) and not _pending(fd):
                    raise EOFError
                if left <= 0:
                    raise TimeoutError
                continue
            k = os.readv(fd, [view[got:]])
            if k == 0:
                raise EOFError
            got += k
        return buf


def _pending(fd: int) -> bool:
    """Bytes are waiting on ``fd`` now (what an ended worker wrote before it ended)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))

"""What a kernel worker sends back to the judging process: plain data, never pickle.

The worker imports and runs the kernel under test, so everything it writes on its socket may be
the kernel's own bytes. Unpickling them would run the kernel's code in the judge (a ``__reduce__``
payload can exit 0 or patch the oracle). So a reply is a frame of plain data:

    b"CPW1" | header length (4 bytes, big-endian) | JSON header | raw array bytes

The header names one message type of this module and its fields; an array field is a reference
``{"array": i}`` to the i-th entry of the header's ``arrays`` list (dtype and shape), whose bytes
follow the header in order. ``decode`` accepts only the types below, only their fields, only the
dtypes in ``DTYPES``, and only sizes that add up; anything else raises ``Malformed``, which the
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
from typing import Callable

import numpy as np

MAGIC = b"CPW1"
_LEN = struct.Struct("!I")
MAX_HEADER = 1 << 20          # bytes of JSON in one reply
MAX_REPLY = 1 << 30           # bytes of one reply, header and arrays together
MAX_TEXT = 16384              # characters of one string field
MAX_LIST = 1 << 16            # items of one list field
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float32", "float64")


class Malformed(Exception):
    """A reply that is not one of this module's messages, well formed."""


# ---- the messages -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ready:
    """The worker has prepared its device (``prepare``)."""


@dataclass(frozen=True)
class RankOutputData:
    """One rank's ``RankOutput`` as arrays and lists (``cpsim.paths.RankOutput`` holds tensors)."""

    slots: np.ndarray                       # [groups, entries] int64
    enabled: list[bool]
    widths: list[int]
    entry_sizes: list[int]
    guard: np.ndarray | None = None         # [groups, 2 * guard width] int64
    written: np.ndarray | None = None       # [groups, inputs] int64
    output_faults: list[int] | None = None


@dataclass(frozen=True)
class RankDone:
    """A rank run that completed: its output (None where the path produced none) and the kernel's notes."""

    path: str
    rank: int
    output: RankOutputData | None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Batch:
    """Every rank of a chunk of cpsim's own kernels, in rank order, in one message."""

    replies: list


@dataclass(frozen=True)
class Refused:
    """The run's input was refused (a ``ConfigError`` in the worker): exit 2 in the parent."""

    field: str
    rule: str


@dataclass(frozen=True)
class Unloaded:
    """The kernel's import (or lookup) raised, exited or failed in the worker."""

    kind: str
    message: str


@dataclass(frozen=True)
class Raised:
    """The rank run raised ``name`` (``text``: its first line and where); ``group``: the group launching."""

    name: str
    text: str
    group: str = "*"


@dataclass(frozen=True)
class Exited:
    """The rank run called ``sys.exit(code)`` (``code`` as its repr)."""

    code: str
    group: str = "*"


@dataclass(frozen=True)
class LostOnReadback:
    """A batched chunk's outputs raised when they were read back (a device fault)."""

    name: str
    text: str


@dataclass(frozen=True)
class SignatureRead:
    """A kernel's signature, read where it was imported (``cpsim.kernels.under_test.Signature``)."""

    name: str
    triton: bool
    is_callable: bool
    params: list[tuple[str, bool]]
    origin: str = ""


@dataclass(frozen=True)
class Value:
    """A ``call``'s result: one integer array, and the kernel's notes."""

    array: np.ndarray
    notes: list[str] = field(default_factory=list)


# The parent's own readings of a worker that did not answer (never sent by a worker).
@dataclass(frozen=True)
class Timeout:
    """No reply within the bound."""


@dataclass(frozen=True)
class Dead:
    """The worker ended (or closed its socket) before a whole reply came."""


@dataclass(frozen=True)
class Garbled:
    """The worker sent something that is not a well-formed reply (``why``)."""

    why: str


MESSAGES = {c.__name__: c for c in (Ready, RankDone, Batch, Refused, Unloaded, Raised, Exited, LostOnReadback,
                                    SignatureRead, Value)}
LOAD_KINDS = ("raised", "exited", "timeout", "crashed")


# ---- encoding (the worker's side) ---------------------------------------------------------------

def encode(msg) -> bytes:
    """One message as a frame."""
    arrays: list[np.ndarray] = []
    header = {"type": type(msg).__name__, "fields": _plain(msg, arrays),
              "arrays": [{"dtype": a.dtype.name, "shape": list(a.shape)} for a in arrays]}
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([MAGIC, _LEN.pack(len(head)), head, *(a.tobytes() for a in arrays)])


def _plain(value, arrays: list):
    if isinstance(value, np.ndarray):
        arrays.append(np.ascontiguousarray(value))
        return {"array": len(arrays) - 1}
    if isinstance(value, (Ready, RankOutputData, RankDone, Batch, Refused, Unloaded, Raised, Exited,
                          LostOnReadback, SignatureRead, Value)):
        if isinstance(value, Batch):
            return {"replies": [{"type": type(r).__name__, "fields": _plain(r, arrays)} for r in value.replies]}
        return {k: _plain(v, arrays) for k, v in value.__dict__.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, arrays) for v in value]
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    return value


# ---- decoding (the judge's side) ----------------------------------------------------------------

def decode(frame: bytes) -> object:
    """The message in ``frame``; ``Malformed`` naming the first thing wrong with it."""
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
        header = json.loads(frame[8:8 + n])
    except (UnicodeDecodeError, ValueError) as e:
        raise Malformed(f"a header that is not JSON ({e})") from None
    _keys(header, {"type", "fields", "arrays"}, "the header")
    arrays = _arrays(header["arrays"], memoryview(frame)[8 + n:])
    used: set[int] = set()
    msg = _message(header, arrays, used)
    if used != set(range(len(arrays))):
        raise Malformed("arrays no field refers to")
    return msg


def _arrays(specs, body: memoryview) -> list[np.ndarray]:
    if not isinstance(specs, list) or len(specs) > MAX_LIST:
        raise Malformed("header.arrays is not a list")
    out, at = [], 0
    for i, spec in enumerate(specs):
        _keys(spec, {"dtype", "shape"}, f"arrays[{i}]")
        dtype, shape = spec["dtype"], spec["shape"]
        if dtype not in DTYPES:
            raise Malformed(f"arrays[{i}] has dtype {str(dtype)[:40]!r} (allowed: {', '.join(DTYPES)})")
        if (not isinstance(shape, list) or len(shape) > 4
                or not all(type(d) is int and 0 <= d <= MAX_REPLY for d in shape)):
            raise Malformed(f"arrays[{i}] has shape {str(shape)[:60]} (up to 4 sizes, each >= 0)")
        nbytes = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
        if at + nbytes > len(body):
            raise Malformed(f"arrays[{i}] needs {nbytes} bytes, {len(body) - at} left in the reply")
        out.append(np.frombuffer(body[at:at + nbytes], dtype=dtype).reshape(shape))
        at += nbytes
    if at != len(body):
        raise Malformed(f"{len(body) - at} bytes after the last array")
    return out


def _keys(d, allowed: set, where: str, optional: frozenset = frozenset()) -> None:
    if not isinstance(d, dict):
        raise Malformed(f"{where} is not an object")
    extra, missing = set(d) - allowed, allowed - optional - set(d)
    if extra or missing:
        raise Malformed(f"{where} has fields {sorted(map(str, extra))[:5]} it should not have"
                        if extra else f"{where} lacks {sorted(missing)}")


def _message(header, arrays: list, used: set):
    kind = header.get("type") if isinstance(header, dict) else None
    if kind not in MESSAGES:
        raise Malformed(f"a message of unknown type {str(kind)[:40]!r}")
    f = header["fields"]
    if kind == "Ready":
        _keys(f, set(), "Ready")
        return Ready()
    if kind == "RankDone":
        _keys(f, {"path", "rank", "output", "notes"}, "RankDone")
        out = None if f["output"] is None else _output(f["output"], arrays, used)
        return RankDone(_text(f["path"], "path"), _int(f["rank"], "rank"), out, _texts(f["notes"], "notes"))
    if kind == "Batch":
        _keys(f, {"replies"}, "Batch")
        replies = f["replies"]
        if not isinstance(replies, list) or len(replies) > MAX_LIST:
            raise Malformed("Batch.replies is not a list")
        for i, r in enumerate(replies):
            _keys(r, {"type", "fields"}, f"Batch.replies[{i}]")
        got = [_message(r, arrays, used) for r in replies]
        if any(isinstance(r, Batch) for r in got):
            raise Malformed("a Batch inside a Batch")
        return Batch(got)
    if kind == "Refused":
        _keys(f, {"field", "rule"}, kind)
        return Refused(_text(f["field"], "field"), _text(f["rule"], "rule"))
    if kind == "Unloaded":
        _keys(f, {"kind", "message"}, kind)
        if f["kind"] not in LOAD_KINDS:
            raise Malformed(f"Unloaded.kind {str(f['kind'])[:40]!r}")
        return Unloaded(f["kind"], _text(f["message"], "message"))
    if kind == "Raised":
        _keys(f, {"name", "text", "group"}, kind)
        return Raised(_text(f["name"], "name"), _text(f["text"], "text"), _text(f["group"], "group"))
    if kind == "Exited":
        _keys(f, {"code", "group"}, kind)
        return Exited(_text(f["code"], "code"), _text(f["group"], "group"))
    if kind == "LostOnReadback":
        _keys(f, {"name", "text"}, kind)
        return LostOnReadback(_text(f["name"], "name"), _text(f["text"], "text"))
    if kind == "SignatureRead":
        _keys(f, {"name", "triton", "is_callable", "params", "origin"}, kind)
        params = f["params"]
        if not isinstance(params, list) or len(params) > 1024 or not all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[1], bool) for p in params):
            raise Malformed("SignatureRead.params is not a list of [name, has_default]")
        return SignatureRead(_text(f["name"], "name"), _bool(f["triton"], "triton"),
                             _bool(f["is_callable"], "is_callable"),
                             [(_text(n, "params"), d) for n, d in params], _text(f["origin"], "origin"))
    _keys(f, {"array", "notes"}, "Value")
    return Value(_array(f["array"], arrays, used, "Value.array", ndim=None, integer=True),
                 _texts(f["notes"], "notes"))


def _output(f, arrays: list, used: set) -> RankOutputData:
    _keys(f, {"slots", "enabled", "widths", "entry_sizes", "guard", "written", "output_faults"}, "output")
    slots = _array(f["slots"], arrays, used, "output.slots", ndim=2, dtype="int64")
    groups = slots.shape[0]
    enabled = f["enabled"]
    if not isinstance(enabled, list) or len(enabled) != groups or not all(isinstance(e, bool) for e in enabled):
        raise Malformed(f"output.enabled is not {groups} booleans")
    guard = None if f["guard"] is None else _array(f["guard"], arrays, used, "output.guard", ndim=2, dtype="int64")
    written = (None if f["written"] is None
               else _array(f["written"], arrays, used, "output.written", ndim=2, dtype="int64"))
    for name, a in (("guard", guard), ("written", written)):
        if a is not None and a.shape[0] != groups:
            raise Malformed(f"output.{name} has {a.shape[0]} rows for {groups} groups")
    faults = f["output_faults"]
    if faults is not None:
        faults = _ints(faults, "output.output_faults", groups)
    return RankOutputData(slots, enabled, _ints(f["widths"], "output.widths", groups),
                          _ints(f["entry_sizes"], "output.entry_sizes", groups), guard, written, faults)


def _array(ref, arrays: list, used: set, where: str, ndim: int | None, dtype: str | None = None,
           integer: bool = False) -> np.ndarray:
    if not isinstance(ref, dict) or set(ref) != {"array"} or type(ref["array"]) is not int \
            or not 0 <= ref["array"] < len(arrays):
        raise Malformed(f"{where} is not a reference to one of the reply's arrays")
    i = ref["array"]
    if i in used:
        raise Malformed(f"{where} refers to an array another field uses")
    used.add(i)
    a = arrays[i]
    if dtype is not None and a.dtype.name != dtype:
        raise Malformed(f"{where} has dtype {a.dtype.name}, not {dtype}")
    if integer and a.dtype.kind not in "iu":
        raise Malformed(f"{where} has dtype {a.dtype.name}, not an integer type")
    if ndim is not None and a.ndim != ndim:
        raise Malformed(f"{where} has {a.ndim} dimensions, not {ndim}")
    return a


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


def _ints(v, where: str, n: int) -> list[int]:
    if not isinstance(v, list) or len(v) != n or not all(type(x) is int for x in v):
        raise Malformed(f"{where} is not {n} integers")
    return v


def _bool(v, where: str) -> bool:
    if not isinstance(v, bool):
        raise Malformed(f"{where} is not true or false")
    return v


# ---- reading a frame (the judge's side) ---------------------------------------------------------

_MP_LEN = struct.Struct("!i")   # ``multiprocessing.connection``'s framing, which ``send_bytes`` writes
_MP_LONG = struct.Struct("!Q")


def read_frame(fd: int, timeout: float, ended: Callable[[], bool], pidfd: int | None = None) -> bytes:
    """One whole message from the socket ``fd`` (the worker's ``send_bytes`` framing), within
    ``timeout`` seconds. ``TimeoutError`` when it does not come whole in time (a kernel that wrote half
    a reply and sleeps), ``EOFError`` when the worker ends first (``ended``; ``pidfd`` becomes
    readable then: a process the kernel forked may hold the socket open after the worker died),
    ``Malformed`` when the length is past ``MAX_REPLY``. Never blocks past the deadline, and never
    allocates more than the length allows."""
    deadline = time.monotonic() + timeout
    (n,) = _MP_LEN.unpack(_read_exactly(fd, _MP_LEN.size, deadline, ended, pidfd))
    if n == -1:
        (n,) = _MP_LONG.unpack(_read_exactly(fd, _MP_LONG.size, deadline, ended, pidfd))
    if not 0 <= n <= MAX_REPLY:
        raise Malformed(f"a reply announcing {n} bytes (at most {MAX_REPLY})")
    return _read_exactly(fd, n, deadline, ended, pidfd)


def _read_exactly(fd: int, n: int, deadline: float, ended: Callable[[], bool], pidfd: int | None) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    while got < n:
        left = deadline - time.monotonic()
        # Without a pidfd the worker's end is looked for every 0.2 s.
        wait = max(0.0, left if pidfd is not None else min(left, 0.2))
        fds = {f for f, _ in poller.poll(int(wait * 1000))}
        if fd not in fds:
            if (pidfd in fds or ended()) and not _pending(fd):
                raise EOFError
            if left <= 0:
                raise TimeoutError
            continue
        k = os.readv(fd, [view[got:]])
        if k == 0:
            raise EOFError
        got += k
    return bytes(buf)


def _pending(fd: int) -> bool:
    """Bytes are waiting on ``fd`` now (what an ended worker wrote before it ended)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))

"""Plain-data messages between cpsim's ranks, never pickle.

A rank's payload (verdicts, rank facts, doctor rows, a stack driver's arrays) is JSON with three markers:
tuples, numeric numpy arrays (dtype, shape, base64 bytes) and dataclasses. The reader names the
dataclasses it accepts and builds each from its own init fields only, so nothing a peer sends can name
code to run; anything else (another class, an object dtype, a shape that does not match its bytes, a
payload past ``MAX_BYTES``) is a ``PlainError``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from typing import Any, Iterable

import numpy as np

MAX_BYTES = 1 << 30     # one rank's payload
MAX_DEPTH = 64
NUMERIC = "biuf"        # the dtype kinds an array may have


class PlainError(ValueError):
    """A payload that is not plain data of the classes the reader accepts."""


def encode(obj: Any) -> bytes:
    return json.dumps(_enc(obj), separators=(",", ":")).encode()


def decode(data: bytes, classes: Iterable[type] = ()) -> Any:
    """``data`` as written by ``encode``, building only the dataclasses in ``classes``."""
    if len(data) > MAX_BYTES:
        raise PlainError(f"payload of {len(data)} bytes, past the {MAX_BYTES}-byte limit")
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise PlainError(f"not JSON: {e}") from None
    return _dec(raw, {c.__name__: c for c in classes}, 0)


def _enc(x: Any) -> Any:
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in NUMERIC:
            raise TypeError(f"not plain data: a {x.dtype} array")
        data = base64.b64encode(np.ascontiguousarray(x).tobytes()).decode()
        return {"__nd__": [x.dtype.str, list(x.shape), data]}
    if isinstance(x, list):
        return [_enc(v) for v in x]
    if isinstance(x, tuple):
        return {"__tuple__": [_enc(v) for v in x]}
    if isinstance(x, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in x):
            return {k: _enc(v) for k, v in x.items()}
        return {"__items__": [[_enc(k), _enc(v)] for k, v in x.items()]}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {"__dc__": type(x).__name__,
                "fields": {f.name: _enc(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init}}
    raise TypeError(f"not plain data: {type(x).__name__}")


def _dec(x: Any, classes: dict[str, type], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise PlainError(f"nested deeper than {MAX_DEPTH}")
    if isinstance(x, list):
        return [_dec(v, classes, depth + 1) for v in x]
    if not isinstance(x, dict):
        return x
    if "__tuple__" in x:
        return tuple(_dec(v, classes, depth + 1) for v in _only(x, "__tuple__", list))
    if "__nd__" in x:
        return _array(_only(x, "__nd__", list))
    if "__items__" in x:
        items = [_dec(kv, classes, depth + 1) for kv in _only(x, "__items__", list)]
        if not all(isinstance(kv, list) and len(kv) == 2 for kv in items):
            raise PlainError("__items__ holds something other than [key, value] pairs")
        try:
            return {k: v for k, v in items}
        except TypeError:
            raise PlainError("an unhashable dict key") from None
    if "__dc__" in x:
        return _dataclass(x, classes, depth)
    return {k: _dec(v, classes, depth + 1) for k, v in x.items()}


def _only(x: dict, key: str, kind: type):
    if len(x) != 1 or not isinstance(x[key], kind):
        raise PlainError(f"malformed {key} entry")
    return x[key]


def _array(spec: list) -> np.ndarray:
    if len(spec) != 3 or not isinstance(spec[0], str) or not isinstance(spec[1], list) \
            or not isinstance(spec[2], str):
        raise PlainError("malformed array entry")
    try:
        dtype = np.dtype(spec[0])
    except TypeError:
        raise PlainError(f"unknown dtype {spec[0]!r}") from None
    shape = spec[1]
    if dtype.kind not in NUMERIC or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise PlainError(f"array of dtype {dtype} and shape {shape} is not a numeric array")
    data = base64.b64decode(spec[2], validate=True)
    if len(data) != math.prod(shape) * dtype.itemsize:
        raise PlainError(f"array of shape {shape} ({dtype}) with {len(data)} bytes")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _dataclass(x: dict, classes: dict[str, type], depth: int):
    if set(x) != {"__dc__", "fields"} or not isinstance(x["fields"], dict):
        raise PlainError("malformed dataclass entry")
    cls = classes.get(x["__dc__"])
    if cls is None:
        raise PlainError(f"class {x['__dc__']!r} is not one this message may hold")
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    if not set(x["fields"]) <= names:
        raise PlainError(f"{cls.__name__} has no field(s) {sorted(set(x['fields']) - names)}")
    try:
        return cls(**{k: _dec(v, classes, depth + 1) for k, v in x["fields"].items()})
    except Exception as e:  # noqa: BLE001  (the class's own checks refuse the fields)
        raise PlainError(f"{cls.__name__}: {e}") from None

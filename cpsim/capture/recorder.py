"""Record every launch of a slot-mapping Triton kernel: arguments in, slot mappings out.

The recorder wraps the kernel *object* (what ``kernel[grid](...)`` is called on),
so it works for any caller: vLLM's and vllm-ascend's runners, cpsim's paths, a
user's test. The wrapper launches the real kernel with the very same arguments
and copies what it needs afterwards, so the kernel computes exactly what it
would without capture; the output is read after the launch (device work is
ordered on the stream, the copy waits for it).

Steps: inside ``with recorder.step(n, rank=r)`` every launch belongs to step ``n``
of rank ``r``. Without it a step ends when a kernel writes an output buffer it
already wrote in the current step (a serving process reuses its persistent
slot-mapping buffers every forward pass). The policy picks steps (every N-th,
a range ``a..b``) and stops when the byte budget is spent.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from cpsim import schema
from cpsim.capture.archive import ArchiveWriter
from cpsim.errors import ConfigError
from cpsim.kernels.under_test import parameters
from cpsim.parsing import parse

FORMAT = "cpsim-capture"
VERSION = 1
SUFFIX = ".cpcap"

# Which parameter names mark a family (see cpsim.kernels.under_test.ABIS).
V1_TABLE, V2_TABLES, FUSED_TABLES = "block_table_ptr", "block_table_ptrs", "block_table_addrs_ptr"
OUTPUT_NAMES = ("slot_mapping_ptr", "slot_mappings_ptr", "slot_mapping_addrs_ptr")


@dataclass(frozen=True)
class Policy:
    every: int = 1                       # record step s when s % every == 0
    first: int = 0                       # steps first..last (inclusive)
    last: int | None = None
    budget: int = 1 << 30                # bytes over all files of this process
    ranks: tuple[int, ...] | None = None  # record only these ranks (one CP group of a TP x CP world)

    def wants(self, step: int, rank: int = 0) -> bool:
        return (step >= self.first and (self.last is None or step <= self.last) and step % self.every == 0
                and (self.ranks is None or rank in self.ranks))


def parse_ranks(text: str, field: str = "CPSIM_CAPTURE_RANKS") -> tuple[int, ...] | None:
    """``0-3,8`` -> (0, 1, 2, 3, 8); empty -> None (every rank)."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        a, sep, b = part.partition("-")
        if not a.isdigit() or (sep and not b.isdigit()) or (sep and int(b) < int(a)):
            raise ConfigError(field, f"{part!r} is not a rank or a range a-b")
        out += range(int(a), int(b) + 1) if sep else [int(a)]
    return tuple(out) or None


def parse_size(text: str, field: str = "CPSIM_CAPTURE_BUDGET") -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        value = int(float(num) * units[unit])
    except ValueError:
        raise ConfigError(field, f"{text!r} is not a size (e.g. 512M, 2G, 1000000)") from None
    if value <= 0:
        raise ConfigError(field, f"must be positive, got {text!r}")
    return value


def parse_steps(text: str, field: str = "CPSIM_CAPTURE_STEPS") -> tuple[int, int | None]:
    """``a..b`` (inclusive), ``a..`` or ``a``."""
    a, sep, b = str(text).partition("..")
    try:
        first = int(a) if a else 0
        last = (int(b) if b else None) if sep else first
    except ValueError:
        raise ConfigError(field, f"{text!r} is not a step range a..b") from None
    if first < 0 or (last is not None and last < first):
        raise ConfigError(field, f"{text!r}: need 0 <= a <= b")
    return first, last


def policy_from_env(env=os.environ) -> Policy:
    every = env.get("CPSIM_CAPTURE_EVERY", "1")
    if not every.isdigit() or int(every) < 1:
        raise ConfigError("CPSIM_CAPTURE_EVERY", f"must be an integer >= 1, got {every!r}")
    first, last = parse_steps(env.get("CPSIM_CAPTURE_STEPS", "0.."))
    budget = parse_size(env.get("CPSIM_CAPTURE_BUDGET", "1G"))
    return Policy(int(every), first, last, budget, parse_ranks(env.get("CPSIM_CAPTURE_RANKS", "")))


def check_meta(meta: Any, root: str = "meta") -> dict[str, Any]:
    """What the kernel arguments do not carry, checked (``schema.CaptureMetaModel``): a misspelt key
    would otherwise be recorded and silently ignored by replay."""
    return parse(schema.CaptureMetaModel, {} if meta is None else meta, root).model_dump(exclude_none=True)


def _distributed() -> bool:
    try:
        import torch.distributed as dist
        return dist.is_available() and dist.is_initialized()
    except ImportError:
        return False


def process_rank() -> int:
    """torch.distributed's rank when initialised, else CPSIM_CAPTURE_RANK, RANK, 0."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:
        pass
    for name in ("CPSIM_CAPTURE_RANK", "RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _params(kernel: Any) -> list[str]:
    return [n for n, _ in parameters(kernel)]


def family(params: list[str]) -> str:
    if V1_TABLE in params:
        return "v1"
    if V2_TABLES in params:
        return "v2"
    if FUSED_TABLES in params:
        return "v1-fused"
    return "unknown"


class _RankFile:
    def __init__(self, path: Path, header: dict[str, Any]):
        self.path = path
        self.writer = ArchiveWriter(path)
        self.writer.json("capture", header)
        self.writer.close()
        self.truncated = False


class Recorder:
    """Owns the per-rank files of one process and the step bookkeeping."""

    def __init__(self, directory: str | Path, policy: Policy = Policy(), rank: int | None = None,
                 meta: dict[str, Any] | None = None):
        self.dir = Path(directory)
        self.policy = policy
        self.fixed_rank = rank
        self.meta = dict(meta or {})
        self.files: dict[int, _RankFile] = {}
        self.bytes = 0
        self.launches = 0
        self.records = 0
        self.failed: str | None = None   # why recording stopped (the kernels keep running unwrapped-equivalent)
        self._scope: tuple[int, int | None] | None = None     # (step, rank) of an explicit step scope
        self._auto: dict[int, tuple[int, set, int]] = {}        # rank -> (step, outputs seen, calls)
        self._calls: dict[tuple[int, int], int] = {}            # (rank, step) -> calls so far
        self._live: dict[int, list[np.ndarray]] = {}            # rank -> the host's live counts for its next launches

    def live_blocks(self, *per_group) -> None:
        """The host's live entries of each table row (vLLM's ``num_blocks``), recorded with the launches
        that follow on this rank until the next call (``live_blocks()`` clears them). v1: before each
        group's launch, that group's counts; a multi-group (v2) launch: one array per group of the launch.
        Replay then knows an id 0 below the count is block 0; without them it reads the count off the row
        (up to the last non-zero id), as captures did before."""
        self._live[self.rank()] = [np.asarray(x, dtype=np.int64).reshape(-1) for x in per_group]

    # ---- steps -------------------------------------------------------------
    @contextmanager
    def step(self, number: int, rank: int | None = None) -> Iterator["Recorder"]:
        """Launches inside belong to step ``number`` (of ``rank``: a virtual world runs all ranks in one process)."""
        old = self._scope
        self._scope = (int(number), rank)
        try:
            yield self
        finally:
            self._scope = old

    def rank(self, fallback: int | None = None) -> int:
        """The scope's rank, the fixed one, torch.distributed's; then ``fallback`` (a host object's own CP
        rank: a virtual world builds every rank's object in one process), else CPSIM_CAPTURE_RANK / RANK / 0."""
        if self._scope is not None and self._scope[1] is not None:
            return self._scope[1]
        if self.fixed_rank is not None:
            return self.fixed_rank
        if fallback is not None and not _distributed():
            return fallback
        return process_rank()

    def _place(self, rank: int, out_key: tuple) -> tuple[int, int]:
        """(step, call) of a launch about to happen."""
        if self._scope is not None:
            step = self._scope[0]
        else:
            step, seen, _ = self._auto.get(rank, (0, set(), 0))
            if out_key in seen:
                step, seen = step + 1, set()
            seen.add(out_key)
            self._auto[rank] = (step, seen, 0)
        call = self._calls.get((rank, step), 0)
        self._calls[(rank, step)] = call + 1
        return step, call

    # ---- files -------------------------------------------------------------
    def _file(self, rank: int) -> _RankFile:
        f = self.files.get(rank)
        if f is None:
            header = {"format": FORMAT, "version": VERSION, "rank": rank, "pid": os.getpid(),
                      "host": socket.gethostname(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "policy": asdict(self.policy), "meta": self.meta}
            f = self.files[rank] = _RankFile(self.dir / f"rank{rank}{SUFFIX}", header)
        return f

    def write(self, rank: int, step: int, call: int, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bool:
        size = sum(a.nbytes for a in arrays.values()) + 4096
        f = self._file(rank)
        if self.bytes + size > self.policy.budget:
            if not f.truncated:
                f.truncated = True
                w = ArchiveWriter(f.path, "a")
                w.json("truncated", {"step": step, "call": call, "budget": self.policy.budget})
                w.close()
            return False
        prefix = f"s{step:08d}/c{call:03d}/"
        w = ArchiveWriter(f.path, "a")
        try:
            w.json(prefix + "meta", meta)
            for name, a in arrays.items():
                w.array(prefix + name, a)
        finally:
            w.close()
        self.bytes += size
        self.records += 1
        return True

    def close(self) -> None:
        self.files.clear()


# ---- the kernel wrapper -----------------------------------------------------------

def _is_tensor(x: Any) -> bool:
    return hasattr(x, "data_ptr") and hasattr(x, "dtype") and hasattr(x, "shape")


def _scalar(x: Any) -> Any:
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if isinstance(x, np.generic):
        return x.item()
    return repr(x)


def _host_tables(ptrs: np.ndarray, strides: np.ndarray, rows: int, device) -> list[np.ndarray]:
    """The int32 tables behind a pointer array (v2 ABIs pass raw addresses, not tensors)."""
    out = []
    for ptr, stride in zip(ptrs.tolist(), strides.tolist()):
        n = rows * int(stride)
        if n == 0 or ptr == 0:
            out.append(np.zeros((rows, int(stride)), dtype=np.int32))
            continue
        if device is None or getattr(device, "type", "cpu") == "cpu":
            buf = (ctypes.c_int32 * n).from_address(int(ptr))
            out.append(np.ctypeslib.as_array(buf).reshape(rows, int(stride)).copy())
        elif device.type == "cuda":
            import torch

            class _View:  # zero-copy view of device memory for torch.as_tensor
                __cuda_array_interface__ = {"shape": (rows, int(stride)), "typestr": "<i4",
                                            "data": (int(ptr), True), "version": 3}
            out.append(torch.as_tensor(_View(), device=device).cpu().numpy())
        else:
            raise ConfigError("capture", f"cannot read v2 table pointers on device {device} yet (CPU and CUDA only)")
    return out


def to_host(views: list, packed: bool) -> list[np.ndarray]:
    """Host copies of integer/bool tensors; ``packed``: one device->host copy for all of them (int64 on the wire)."""
    import torch
    if not packed:
        return [v.detach().numpy().copy() for v in views]
    flat = torch.cat([v.reshape(-1).to(torch.int64) for v in views]).cpu() if views else torch.zeros(0)
    parts = torch.split(flat, [v.numel() for v in views])
    return [p.to(v.dtype).reshape(v.shape).numpy() for p, v in zip(parts, views)]


class CapturedKernel:
    """Stands in for a Triton kernel object; ``kernel[grid](...)`` launches it and records the launch."""

    def __init__(self, kernel: Any, recorder: Recorder, name: str | None = None):
        self.__wrapped__ = kernel
        self._recorder = recorder
        self._params = _params(kernel)
        self._family = family(self._params)
        self._name = name or getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", "?")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __getitem__(self, grid):
        launch = self.__wrapped__[grid]

        def run(*args, **kwargs):
            return self._launch(launch, grid, args, kwargs)
        return run

    def _launch(self, launch, grid, args, kwargs):
        rec = self._recorder
        bound = dict(zip(self._params, args)) | kwargs
        out = next((bound[n] for n in OUTPUT_NAMES if n in bound), None)
        rank = rec.rank()
        step, call = rec._place(rank, (self._name, out.data_ptr() if _is_tensor(out) else id(out)))
        result = launch(*args, **kwargs)
        rec.launches += 1
        if rec.policy.wants(step, rank) and not rec.failed:
            try:
                g = grid(bound) if callable(grid) else grid
                g = tuple(int(x) for x in (g if isinstance(g, (tuple, list)) else (g,)))
                meta, arrays = self._collect(bound, g)
                arrays |= {f"live/g{k}": a for k, a in enumerate(rec._live.get(rank, ()))}
                meta |= {"kernel": self._name, "family": self._family, "params": self._params, "grid": list(g),
                         "step": step, "call": call, "rank": rank}
                rec.write(rank, step, call, meta, arrays)
            except Exception as e:  # noqa: BLE001 - recording must never take the serving process down
                rec.failed = f"{type(e).__name__}: {e}"
                print(f"cpsim.capture: recording stopped at step {step} call {call} of rank {rank}: {rec.failed}",
                      file=sys.stderr)
        return result

    def _collect(self, bound: dict[str, Any], grid: tuple[int, ...]) -> tuple[dict, dict[str, np.ndarray]]:
        """Scalars into JSON; tensors (trimmed to what the launch reads) into arrays, one host copy."""
        scalars = {k: _scalar(v) for k, v in bound.items() if not _is_tensor(v)}
        tensors = {k: v for k, v in bound.items() if _is_tensor(v)}
        fam = self._family
        num_reqs = grid[-1] - 1 if grid else 0
        trims: dict[str, int] = {}
        if fam == "v1":
            trims = {"query_start_loc_ptr": num_reqs + 1, V1_TABLE: num_reqs}
        elif fam == "v2":
            trims = {"query_start_loc": num_reqs + 1, "idx_mapping": num_reqs}
        names = list(tensors)
        views = [tensors[k][: trims[k]] if k in trims else tensors[k] for k in names]
        device = next((t.device for t in views), None)
        arrays = dict(zip(names, to_host(views, packed=device is not None and device.type != "cpu")))
        if fam == "v2":
            ptrs, strides = arrays.get(V2_TABLES), arrays.get("block_table_strides")
            idx = arrays.get("idx_mapping")
            if ptrs is not None and strides is not None and idx is not None:
                rows = int(idx.max()) + 1 if idx.size else 0
                for gi, t in enumerate(_host_tables(ptrs, strides, rows, device)):
                    arrays[f"table{gi}"] = t
        return {"scalars": scalars, "dtypes": {k: str(v.dtype) for k, v in tensors.items()}}, arrays


def wrap(kernel: Any, recorder: Recorder, name: str | None = None) -> CapturedKernel:
    if isinstance(kernel, CapturedKernel):
        return kernel
    return CapturedKernel(kernel, recorder, name)

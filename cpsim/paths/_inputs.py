"""Batch tensors every path hands its kernels, and the one-copy upload of small host arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cpsim import kernels
from cpsim.scenario import Scenario

_ALIGN = 16  # bytes: every array starts 16-aligned, as Triton specialises pointers on it (and as torch allocates)


def upload(arrays: list[np.ndarray], device) -> list[torch.Tensor]:
    """``arrays`` on ``device`` as views into one fresh buffer, copied in a single transfer.

    On an accelerator every small ``torch.tensor(..., device=...)`` is a copy of its own, and a rank
    run hands its kernels a dozen of them; on CPU the buffer is fresh too, so a kernel that writes
    into its inputs cannot reach the caller's arrays. On CUDA the host side is pinned and the copy does
    not wait: a copy from ordinary memory waits for the stream to drain first, which made every upload
    a stall behind the launches queued before it. The pinned block is not handed out again before the
    copy is done (torch's host allocator records the copy on the stream).
    """
    arrays = [np.ascontiguousarray(a) for a in arrays]
    offsets, size = [], 0
    for a in arrays:
        offsets.append(size)
        size += -(-a.nbytes // _ALIGN) * _ALIGN
    device = torch.device(device)
    pinned = device.type == "cuda"
    staging = torch.empty(max(size, _ALIGN), dtype=torch.uint8, pin_memory=pinned)
    host = staging.numpy()
    for a, o in zip(arrays, offsets):
        host[o:o + a.nbytes] = a.reshape(-1).view(np.uint8)
    buf = staging.to(device, non_blocking=pinned)
    typed: dict[np.dtype, torch.Tensor] = {}  # the whole buffer seen as each dtype: one view per dtype
    out = []
    for a, o in zip(arrays, offsets):
        if a.dtype not in typed:
            typed[a.dtype] = buf.view(_TORCH[a.dtype])
        start = o // a.itemsize
        view = typed[a.dtype][start:start + a.size]
        out.append(view if a.ndim == 1 else view.view(a.shape))
    return out


_TORCH = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(bool): torch.bool,
          np.dtype(np.uint8): torch.uint8}


@dataclass
class BatchTensors:
    query_start_loc: torch.Tensor   # int32 [num_reqs + 1]
    positions: torch.Tensor         # int64 [num_tokens_padded]
    num_tokens: int                 # what the caller passes: the padded count
    num_scheduled: int


def batch_arrays(s: Scenario, clamp: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(query_start_loc int32, capped at ``clamp`` when given; positions int64 zero-padded to the padded
    token count), on the host."""
    b = s.batch
    positions = np.zeros(max(b.num_tokens_padded, b.num_tokens), dtype=np.int64)
    positions[: b.num_tokens] = b.positions()
    qsl = b.query_start_loc()
    if clamp is not None:
        qsl = np.minimum(qsl, clamp)  # a short buffer drops tokens; the capacity invariant reports it
    return qsl.astype(np.int32), positions


def upload_batch(s: Scenario, device, clamp: int | None = None, *extra: np.ndarray
                 ) -> tuple[BatchTensors, list[torch.Tensor]]:
    """(the batch's tensors, ``extra``'s tensors), all in one copy."""
    qsl, positions = batch_arrays(s, clamp)
    up = upload([qsl, positions, *extra], device)
    return BatchTensors(up[0], up[1], positions.size, s.batch.num_tokens), up[2:]


def batch_tensors(s: Scenario, device: torch.device, *extra: np.ndarray, clamp: int | None = None,
                  shared: tuple | None = None, own: tuple | None = None) -> BatchTensors | tuple:
    """The batch's tensors on ``device`` (``query_start_loc`` capped at ``clamp``, the slot buffer's
    entries, when given); with ``extra`` host arrays, also those, uploaded in the same copy (returns
    ``(BatchTensors, [tensors])`` then).

    ``shared``: ``(key, make)``, where ``make()`` gives host arrays that depend on the scenario and
    on ``key`` alone, not on the rank; their tensors come first in the list. Inside a stage they are
    uploaded once for all staged ranks; outside, in the same copy.

    ``own``: ``(key, arrays, make)``: this rank's host ``arrays``, which depend on the scenario, ``key``,
    the rank's allocations and its tables alone; ``make(allocs, peer)`` makes them for another rank
    (``Stage.per_rank``). Inside a stage every staged rank's are made and uploaded in one copy; their
    tensors come after ``shared``'s, before ``extra``'s."""
    from cpsim.paths import prep as _stage
    stage = _stage.of(s, device)
    if stage is not None:
        bt = stage.batch(clamp)  # uploaded once for every staged rank
        if not extra and shared is None and own is None:
            return bt
        common = stage.shared(*shared) if shared is not None else []
        mine = stage.per_rank(own[0], own[2]) if own is not None else []
        if mine is None:  # this rank's tables are not staged: its arrays go with ``extra``
            extra = (*own[1], *extra)
            mine = []
        return bt, [*common, *mine, *(upload(list(extra), device) if extra else [])]
    bt, rest = upload_batch(s, device, clamp, *(shared[1]() if shared is not None else []),
                            *(own[1] if own is not None else []), *extra)
    return (bt, rest) if extra or shared is not None or own is not None else bt


def shared_upload(s: Scenario, device, key, make) -> list[torch.Tensor]:
    """``make()``'s host arrays on ``device``: uploaded once per stage when ``s``'s ranks are staged
    (they must depend on the scenario and ``key`` alone), else now."""
    from cpsim.paths import prep as _stage
    stage = _stage.of(s, device)
    if stage is not None:
        return stage.shared(key, make)
    return upload(list(make()), device)


_prepared: dict[str, object] = {}


def prepare_triton(device: torch.device):
    """Triton for ``device`` (the interpreter on CPU), imported and patched once per process."""
    if device.type not in _prepared:
        if device.type == "cpu":
            kernels.use_interpreter()
        triton = kernels.import_triton()
        if device.type == "cpu":
            from cpsim.kernels import _interp
            _interp.install()
        _prepared[device.type] = triton
    return _prepared[device.type]

"""Batch tensors every path hands its kernels, and the one-copy upload of small host arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cpsim import kernels
from cpsim.scenario import Scenario
from cpsim.kernels import _interp

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


def batch_tensors(s: Scenario, device: torch.device, clamp: int | None = None) -> BatchTensors:
    """The batch's tensors on ``device``, fresh, in one copy (``query_start_loc`` capped at ``clamp``)."""
    return upload_batch(s, device, clamp)[0]


_prepared: dict[str, object] = {}


def prepare_triton(device: torch.device):
    """Triton for ``device`` (the interpreter on CPU), imported and patched once per process."""
    if device.type not in _prepared:
        if device.type == "cpu":
            kernels.use_interpreter()
        triton = kernels.import_triton()
        if device.type == "cpu":
            _interp.install()
        _prepared[device.type] = triton
    return _prepared[device.type]

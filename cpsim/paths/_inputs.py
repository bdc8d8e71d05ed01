"""Batch tensors every path hands its kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpsim import kernels
from cpsim.scenario import Scenario


@dataclass
class BatchTensors:
    query_start_loc: torch.Tensor   # int32 [num_reqs + 1]
    positions: torch.Tensor         # int64 [num_tokens_padded]
    num_tokens: int                 # what the caller passes: the padded count
    num_scheduled: int


def batch_tensors(s: Scenario, device: torch.device) -> BatchTensors:
    b = s.batch
    padded = max(b.num_tokens_padded, b.num_tokens)
    positions = torch.zeros(padded, dtype=torch.int64)
    positions[: b.num_tokens] = torch.from_numpy(b.positions())
    qsl = torch.from_numpy(b.query_start_loc()).to(torch.int32)
    return BatchTensors(qsl.to(device), positions.to(device), padded, b.num_tokens)


def prepare_triton(device: torch.device):
    if device.type == "cpu":
        kernels.use_interpreter()
    triton = kernels.import_triton()
    if device.type == "cpu":
        from cpsim.kernels import _interp
        _interp.install()
    return triton

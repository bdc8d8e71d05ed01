"""The runtime's own process groups, for a stack run under torchrun (runs only in the stack driver child).

In the virtual world the adapters answer ``get_dcp_group`` / ``get_pcp_group`` with the rank being
built. Under torchrun each rank's driver child instead sets the groups up as a vLLM worker does
(``vllm/v1/worker/gpu_worker.py`` ``init_worker_distributed_environment``, read from vLLM 0.13.0-0.33.0:
the same two calls and signatures in every release read): with the worker's ``VllmConfig`` current,
``init_distributed_environment(world_size, rank, init_method, local_rank, backend, timeout)`` and then
``ensure_model_parallel_initialized(TP, PP, PCP, DCP, backend)`` with TP = the world, PP = PCP = 1.
The host classes then ask vLLM's real ``get_dcp_group()`` (``vllm.distributed.parallel_state``) for
their DCP size and rank, and the MRV2 runner's ``cp_rank`` is its ``rank_in_group``, as in
``gpu/model_runner.py``. vllm-ascend's tables import the same functions from vLLM, so one module
serves both families.

Backend gloo, tensors on the CPU: the host classes are driven on CPU tensors (the adapters' CPU
patches) even on a GPU or NPU host; what is real is the group layout and each rank's place in it.

Host classes of your own (``--stack-classes``) bring their own groups: the file defines
``init_distributed(world_size, rank, init_method, dcp, timeout_s)`` and a ``get_dcp_group()``
that answers from what it set up.
"""

from __future__ import annotations

import inspect
from datetime import timedelta

# Where the groups come from, for the patch list the driver reports.
VLLM_GROUPS = ("process groups: vLLM's own init_distributed_environment (backend gloo, the torchrun rank, "
               "a TCP rendezvous of its own) and ensure_model_parallel_initialized(TP = world, PP 1, PCP 1, DCP) "
               "with a VllmConfig(device cpu, that parallel config) current; get_dcp_group / get_pcp_group are "
               "vLLM's, not answered by cpsim")
OWN_GROUPS = "process groups: the classes file's own init_distributed(...) and get_dcp_group()"


def init(dist: dict, meta: dict, module) -> dict:
    """Set up the groups of this rank; the DCP and PCP sizes and ranks the runtime then reports."""
    timeout_s = float(dist["timeout_s"])
    dcp = meta["cp"]["dcp"]
    if getattr(module, "own", False):
        classes = module.bt
        classes.init_distributed(dist["world"], dist["rank"], dist["init_method"], dcp, timeout_s)
        g = classes.get_dcp_group()
        return {"dcp_world": g.world_size, "dcp_rank": g.rank_in_group, "pcp_world": 1, "pcp_rank": 0,
                "source": OWN_GROUPS}
    from vllm.config import DeviceConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    world = dist["world"]
    config = VllmConfig(device_config=DeviceConfig(device="cpu"),
                        parallel_config=ParallelConfig(tensor_parallel_size=world, decode_context_parallel_size=dcp))
    init_kw = {"timeout": timedelta(seconds=timeout_s)} \
        if "timeout" in inspect.signature(ps.init_distributed_environment).parameters else {}
    with set_current_vllm_config(config):
        ps.init_distributed_environment(world, dist["rank"], dist["init_method"], dist["rank"], "gloo", **init_kw)
        ps.ensure_model_parallel_initialized(world, 1, 1, dcp, "gloo")
    d, p = ps.get_dcp_group(), ps.get_pcp_group()
    return {"dcp_world": d.world_size, "dcp_rank": d.rank_in_group, "pcp_world": p.world_size,
            "pcp_rank": p.rank_in_group, "source": VLLM_GROUPS}


def close(module) -> None:
    """Tear the groups down (vLLM's TP group holds a shared-memory message queue)."""
    if getattr(module, "own", False):
        end = getattr(module.bt, "destroy_distributed", None)
        if end is not None:
            end()
        return
    from vllm.distributed import parallel_state as ps
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()

"""A hostile sizing module: at import it patches cpsim's judges to pass everything, then answers the
mamba width divided by CP (vllm-ascend #9724) and no draft reserve (vllm-ascend #14024)."""

import cpsim.check.coordinator as coordinator
import cpsim.check.profiles as profiles
import cpsim.sizing as cpsim_sizing

coordinator.block_sizing = lambda *a, **k: []
coordinator.capacity = lambda *a, **k: []
coordinator.passed = lambda verdicts: True
profiles.slot_buffer_need = lambda *a, **k: 0
cpsim_sizing.read_answer = lambda answer, h, source: cpsim_sizing.HostSizing(h["host"], (10**6,) * len(h["groups"]),
                                                                           10**6, source)


def sizing(host):
    world = host["dcp_world_size"] * host["pcp_world_size"]
    widths = [-(-host["max_model_len"] // (g["block_size"] * world)) for g in host["groups"]]
    return {"table_widths": widths, "slot_buffer_len": host["max_num_batched_tokens"]}

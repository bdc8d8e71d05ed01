"""Drive the host block-table classes a runtime release ships (vLLM, vllm-ascend), one instance per CP rank.

cpsim's paths re-implement the runtimes' host logic; this package runs the real
thing instead. The release's code is user code here: it runs only in a child
process (:mod:`cpsim.stack.driver`, started with the side venv's python), which
imports nothing of cpsim but this package and :mod:`cpsim.stack.exchange`, and
hands back plain arrays. The parent (:mod:`cpsim.stack.host`) turns them into an
explicit step and judges it with the coordinator.

One adapter module per release family (``vllm``, ``vllm_ascend``) names the
releases it was read from and every patch it needs to run them on a CPU.
"""

FAMILIES = {"vllm": "cpsim.stack.vllm", "vllm-ascend": "cpsim.stack.vllm_ascend"}
# The slot buffer each family's hosts allocate, read from the releases: vLLM 0.23-0.34 int64
# (``BlockTable.slot_mapping``, vllm/v1/worker/block_table.py; ``BlockTables.slot_mappings``, gpu/block_table.py);
# vllm-ascend 0.18.0 / 0.23.0.post1 int32 (vllm_ascend/worker/block_table.py, worker/v2/block_table.py).
HOST_SLOT_DTYPES = {"vllm": "int64", "vllm-ascend": "int32"}

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

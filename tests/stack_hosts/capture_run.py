"""A serving process in miniature: host classes of our own in vllm-ascend's shape, one object per DCP rank,
their compute_slot_mapping called inside cpsim.capture with the host target (the capture tests' subject).

``python capture_run.py MODULE OUT``: MODULE is ascend_shape or one of its bug variants. Block id 0 is handed
out as a real block (the row's num_blocks says so), as an explicit batch may.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).parent))
module, out = sys.argv[1], sys.argv[2]
classes = __import__(module)
import ascend_shape  # noqa: E402  (the variants patch its switches; the classes live there)

from cpsim import capture  # noqa: E402

DCP, INTERLEAVE, MAX_MODEL_LEN = 4, 16, 4096
BLOCKS, KERNELS = [128, 16, 128], [[64], [0], [0]]
REQUESTS = [(0, 300), (700, 3), (1500, 40)]    # (computed tokens, scheduled tokens)
IDS = [[[0], [9, 10], [11, 12, 13, 14]],         # group 0: block 0 is request 0's only block
       [[1, 2, 3, 4, 6], [7, 8, 10, 15, 16, 17, 18, 19, 20, 21, 22], [23 + i for i in range(25)]],
       [[30], [31], [32]]]                      # mamba: one state block each


def main() -> None:
    specs = [SimpleNamespace(kv_cache_spec=ascend_shape.AttentionSpec()),
             SimpleNamespace(kv_cache_spec=ascend_shape.AttentionSpec()),
             SimpleNamespace(kv_cache_spec=ascend_shape.MambaSpec())]
    qsl = torch.tensor([0] + [sum(n for _, n in REQUESTS[: i + 1]) for i in range(len(REQUESTS))], dtype=torch.int32)
    pos = torch.cat([torch.arange(c, c + n) for c, n in REQUESTS])
    target = "ascend_shape:MultiGroupBlockTable.compute_slot_mapping"
    with capture.capture(out, [target], meta={"max_model_len": MAX_MODEL_LEN, "num_blocks": 64}):
        for rank in range(DCP):
            ascend_shape.get_dcp_group = lambda: SimpleNamespace(world_size=DCP, rank_in_group=rank)
            t = classes.MultiGroupBlockTable(8, MAX_MODEL_LEN, 512, False, torch.device("cpu"), BLOCKS,
                                             kernel_sizes=KERNELS, cp_kv_cache_interleave_size=INTERLEAVE,
                                             kv_cache_groups=specs)
            for i in range(len(REQUESTS)):
                t.add_row(tuple(g[i] for g in IDS), i)
            t.compute_slot_mapping(len(REQUESTS), qsl, pos)


if __name__ == "__main__":
    main()

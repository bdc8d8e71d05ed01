"""A sizing function of our own in vllm-ascend 0.23.0.post1's v1 constructor arithmetic
(model_runner_v1.py's widths, then BlockTable's), with attention divided by each group's own CP
size (cpsim's per-group CP model). The two switches are the two host bugs upstream shipped;
both on is the correct behaviour:

- MAMBA_WIDTH_TIMES_CP (vllm-ascend #9724): a mamba group's width is multiplied back by CP;
- MTP_DRAFT_RESERVE (vllm-ascend #14024): the slot buffer holds (num_speculative_tokens - 1) x
  max_num_reqs draft entries.

The arithmetic itself is cpsim's built-in ``vllm-ascend-0.23`` (cpsim.sizing), so the release's
built-in and these twins are the same functions.
"""

from cpsim.sizing import ascend_0_23_buffer, ascend_0_23_width

MAMBA_WIDTH_TIMES_CP = True
MTP_DRAFT_RESERVE = True


def sizing(host):
    return {"table_widths": [ascend_0_23_width(host, g, mamba_times_cp=MAMBA_WIDTH_TIMES_CP, per_group_cp=True)
                             for g in host["groups"]],
            "slot_buffer_len": ascend_0_23_buffer(host, draft_reserve=MTP_DRAFT_RESERVE)}

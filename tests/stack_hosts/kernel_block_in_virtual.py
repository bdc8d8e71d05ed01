"""ascend_shape with one host bug upstream shipped (vllm-ascend #10442): KV_BLOCK_IN_VIRTUAL_BLOCK off."""

from ascend_shape import *  # noqa: F401,F403
import ascend_shape

ascend_shape.KV_BLOCK_IN_VIRTUAL_BLOCK = False
ascend_shape.NAME = "ascend_shape, vllm-ascend #10442 (KV_BLOCK_IN_VIRTUAL_BLOCK off)"
NAME = ascend_shape.NAME

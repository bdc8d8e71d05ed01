"""ascend_shape with one host bug upstream shipped (vllm-ascend #9724): MAMBA_WIDTH_TIMES_CP off."""

from ascend_shape import *  # noqa: F401,F403
import ascend_shape

ascend_shape.MAMBA_WIDTH_TIMES_CP = False
ascend_shape.NAME = "ascend_shape, vllm-ascend #9724 (MAMBA_WIDTH_TIMES_CP off)"
NAME = ascend_shape.NAME

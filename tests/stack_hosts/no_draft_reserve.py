"""ascend_shape with one host bug upstream shipped (vllm-ascend #14024): MTP_DRAFT_RESERVE off."""

from ascend_shape import *  # noqa: F401,F403
import ascend_shape

ascend_shape.MTP_DRAFT_RESERVE = False
ascend_shape.NAME = "ascend_shape, vllm-ascend #14024 (MTP_DRAFT_RESERVE off)"
NAME = ascend_shape.NAME

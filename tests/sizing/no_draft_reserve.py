"""ascend_shape with vllm-ascend #14024: the slot buffer has no MTP draft reserve."""

import ascend_shape  # noqa: E402

ascend_shape.MTP_DRAFT_RESERVE = False
sizing = ascend_shape.sizing

"""ascend_shape with vllm-ascend #9724: the mamba width is not multiplied back by CP."""

import ascend_shape  # noqa: E402  (tests/sizing is on sys.path: the file's folder)

ascend_shape.MAMBA_WIDTH_TIMES_CP = False
sizing = ascend_shape.sizing

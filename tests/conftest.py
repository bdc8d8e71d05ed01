import os

import pytest

# Where kernel tests run. CI and laptops: "cpu" (the Triton interpreter, which
# must be chosen before triton is first imported). On a GPU box:
#   CPSIM_TEST_DEVICE=cuda pytest tests/test_kernels.py
DEVICE = os.environ.get("CPSIM_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings  # noqa: E402


@pytest.fixture(scope="session")
def device() -> str:
    return DEVICE

settings.register_profile("cpsim", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("cpsim")

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


def pytest_collection_modifyitems(items):
    """Longest first, so that ``make test``'s workers end together: the modules holding a test marked
    ``slow`` or ``dist`` run first, and in each module those tests come first. xdist hands the tests out
    in this order, in chunks, so both workers start on the long ones and the last chunks hold short ones
    (the 43 s torchrun rows used to sort last). A module stays in one piece (its module-scoped fixtures
    are set up once); the order is the same in every worker, as xdist requires."""
    def long(item) -> bool:
        return item.get_closest_marker("slow") is not None or item.get_closest_marker("dist") is not None

    def module(item) -> str:
        return item.nodeid.split("::")[0]

    heavy = {module(item) for item in items if long(item)}
    first: dict[str, int] = {}
    for item in items:
        first.setdefault(module(item), len(first))
    items.sort(key=lambda item: (module(item) not in heavy, first[module(item)], not long(item)))

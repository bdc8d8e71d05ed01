"""``cpsim.kernels.under_test.load`` and ``from_record`` as cpsim's commands call them: a kernel SPEC
is read by a kernel worker (``cpsim.run.isolation.probe``), never imported by the test's process."""

from cpsim.kernels import under_test
from cpsim.run import isolation


def load(*args, **kwargs):
    return under_test.load(*args, inspect=kwargs.pop("inspect", isolation.probe), **kwargs)


def from_record(*args, **kwargs):
    return under_test.from_record(*args, inspect=kwargs.pop("inspect", isolation.probe), **kwargs)

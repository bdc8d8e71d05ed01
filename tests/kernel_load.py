"""The test session's kernel runner, and ``cpsim.kernels.under_test.load`` / ``from_record`` as cpsim's
commands call them: a kernel SPEC is read by a worker of ``RUNNER`` (``KernelRunner.probe``), never
imported by the test's process.

``RUNNER`` is the long-lived caller's runner (``cpsim.run.runner``): tests hand it to what runs kernels
(``run_virtual(..., runner=RUNNER)``, ``cli.main(argv, runner=RUNNER)``), so its workers stay warm across
tests; a call handed none starts workers of its own (seconds each)."""

from cpsim.kernels import under_test
from cpsim.run.runner import KernelRunner

RUNNER = KernelRunner()


def load(*args, **kwargs):
    return under_test.load(*args, inspect=kwargs.pop("inspect", RUNNER.probe), **kwargs)


def from_record(*args, **kwargs):
    return under_test.from_record(*args, inspect=kwargs.pop("inspect", RUNNER.probe), **kwargs)

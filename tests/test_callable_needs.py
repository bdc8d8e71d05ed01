"""Issue 30 item 6: a group the callable ABI cannot judge without an input it did not ask for is
"not checked: ask for X", not a failure; the same callable asking for X and ignoring it fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpsim import cli
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

K = f"{Path(__file__).parent / 'kernels'}/callable_needs.py"
SMALL = str(Path(__file__).parent.parent / "examples" / "small-cp4.json")


def _run(capsys, scenario, fn):
    rc = cli.main(["run", "--scenario", scenario, "--paths", "v1", "--kernel-v1", f"{K}:{fn}"], runner=RUNNER)
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("scenario, fn, ask", [
    (SMALL, "no_circular", "is_circular"),            # a ring group, no is_circular
    ("released-window", "world_only", "cp_sharded"),  # a replicated slot-mapped group, only the world CP size
])
def test_a_group_needing_an_unasked_input_is_not_checked(capsys, scenario, fn, ask):
    rc, out = _run(capsys, scenario, fn)
    assert rc == 0 and f"not checked: ask for {ask}" in out


@pytest.mark.parametrize("scenario, fn, invariant", [
    (SMALL, "ignores_circular", "no-collision"),
    ("released-window", "world_ignores_flag", "exactly-one-owner"),
])
def test_asking_for_the_input_and_ignoring_it_fails(capsys, scenario, fn, invariant):
    rc, out = _run(capsys, scenario, fn)
    assert rc == 1 and "not checked: ask for" not in out
    assert any(line.split("│")[1].strip() == invariant and "FAIL" in line for line in out.splitlines()
               if line.count("│") > 2)

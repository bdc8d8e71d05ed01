"""The pytest plugin in a user's own pytest run (pytester), with and without xdist."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpsim import kernels
from cpsim.plugin import testing

pytest_plugins = ["pytester"]

KERNELS = Path(__file__).parent / "kernels"
GOOD = f"{KERNELS}/ascend_v1_abi.py:_compute_slot_mapping_kernel"
FAST = ["--cpsim-scenarios", "mtp,random:1", "-p", "cpsim.plugin.testing", "-p", "no:warnings"]


@pytest.fixture(autouse=True, scope="module")
def _warm():
    """Import Triton and the interpreter here: pytester's inline runs drop modules first imported
    inside them, and Triton's native extension cannot be imported twice in one process."""
    kernels.use_interpreter()
    testing.check_kernel(GOOD, scenarios=["random:1"])


def _broken(pytester) -> str:
    text = (KERNELS / "ascend_v1_abi.py").read_text()
    old = "mine = (vo // CP_KV_CACHE_INTERLEAVE_SIZE) % TOTAL_CP_WORLD_SIZE == TOTAL_CP_RANK"
    assert text.count(old) == 1
    f = pytester.path / "user_kernel.py"
    f.write_text(text.replace(old, "mine = vo >= 0"))  # every rank claims every token
    return f"{f}:_compute_slot_mapping_kernel"


def test_good_kernel_passes_in_a_user_run(pytester):
    pytester.makepyfile(test_user="def test_theirs():\n    assert True\n")
    res = pytester.runpytest("--cpsim-kernel-v1", GOOD, *FAST)
    res.assert_outcomes(passed=3)
    res.stdout.no_fnmatch_line("*FAIL*")


def test_broken_kernel_fails_with_the_violation_report(pytester):
    res = pytester.runpytest("--cpsim-kernel-v1", _broken(pytester), *FAST)
    res.assert_outcomes(failed=2)
    res.stdout.fnmatch_lines(["*✗ exactly-one-owner [[]v1] group attn*", "*FAILED cpsim::v1[[]mtp]*"])


def test_profile_option_is_accepted_and_shown_in_the_report(pytester):
    res = pytester.runpytest("--cpsim-kernel-v1", _broken(pytester), "--cpsim-profile", "vllm-ascend-0.23", *FAST)
    res.assert_outcomes(failed=2)
    res.stdout.fnmatch_lines(["*profile: vllm-ascend-0.23 (vllm-ascend*"])
    res = pytester.runpytest("--cpsim-kernel-v1", GOOD, "--cpsim-profile", "vllm-9.9", *FAST)
    res.assert_outcomes(failed=2)
    res.stdout.fnmatch_lines(["*--profile*unknown profile 'vllm-9.9'*"])


def test_plugin_is_inert_without_its_options(pytester):
    pytester.makepyfile(test_user="def test_theirs():\n    assert True\n")
    res = pytester.runpytest("-p", "cpsim.plugin.testing", "-p", "no:warnings")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["collected 1 item"])
    res.stdout.no_fnmatch_line("*cpsim::*")


def test_bad_spec_is_reported_without_a_traceback(pytester):
    res = pytester.runpytest("--cpsim-kernel-v2", f"{KERNELS}/wrong_signature.py:_compute_slot_mapping_kernel",
                             *FAST)
    res.assert_outcomes(failed=2)
    res.stdout.fnmatch_lines(["*matches no kernel ABI*"])
    res.stdout.no_fnmatch_line("*Traceback*")


def test_works_under_xdist(pytester):
    res = pytester.runpytest_subprocess("-n", "2", "--cpsim-kernel-v1", _broken(pytester), *FAST)
    res.assert_outcomes(failed=2)
    res.stdout.fnmatch_lines(["*exactly-one-owner*"])

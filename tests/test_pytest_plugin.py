"""The pytest plugin in a user's own pytest run (pytester), with and without xdist."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cpsim import kernels
from cpsim.plugin import testing
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

pytest_plugins = ["pytester"]

KERNELS = Path(__file__).parent / "kernels"
GOOD = f"{KERNELS}/ascend_v1_abi.py:_compute_slot_mapping_kernel"
FAST = ["--cpsim-scenarios", "mtp,random:1", "-p", "cpsim.plugin.testing", "-p", "no:warnings"]


@pytest.fixture(autouse=True, scope="module")
def _warm():
    """Import Triton and the interpreter here: pytester's inline runs drop modules first imported
    inside them, and Triton's native extension cannot be imported twice in one process."""
    kernels.use_interpreter()
    testing.check_kernel(GOOD, scenarios=["random:1"], runner=RUNNER)


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


def test_plugin_without_its_options_loads_no_checking_code(pytester):
    """Every pytest run in the environment loads the plugin: without its options it imports nothing of
    cpsim (cpsim.plugin.check loads numpy and pydantic), however pytest probes the plugin module."""
    pytester.makepyfile(test_user="import sys\n\ndef test_theirs():\n"
                                  "    assert sorted(m for m in sys.modules if m.startswith('cpsim.')) == "
                                  "['cpsim.plugin', 'cpsim.plugin.testing']\n")
    res = pytester.runpytest_subprocess("-p", "cpsim.plugin.testing", "-p", "no:warnings", "-p", "no:hypothesispytest")
    res.assert_outcomes(passed=1)


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


FORKS = f"{KERNELS}/forks_setsid.py"
USER_TESTS = f'''
import os, sys
import pytest
sys.path.insert(0, {str(KERNELS)!r})
import forks_setsid as fk
from cpsim.plugin.testing import check_kernel
from cpsim.run.runner import KernelRunner

PIDS = os.environ["CPSIM_TEST_PIDS"]


def test_a_timed_out_workers_setsid_child_ends_with_the_worker():
    with KernelRunner() as runner, pytest.raises(AssertionError, match=r"kernel exceeded 5 s \\(worker killed\\) on rank 0"):
        runner.configure(timeout_s=5)
        check_kernel("{FORKS}:then_hangs", scenarios=["mtp"], runner=runner)
    pids = fk.pids(PIDS, "then_hangs")
    assert pids and not any(map(fk.alive, pids))


def test_the_orphan_of_a_worker_its_kernel_killed_is_swept_when_the_check_ends():
    with KernelRunner() as runner, pytest.raises(AssertionError, match="kernel crashed with SIGKILL on rank 0"):
        runner.configure(timeout_s=60)  # well below the orphan's sleep: waiting for the pipe alone is a timeout
        check_kernel("{FORKS}:then_kills_worker", scenarios=["mtp"], runner=runner)
    pids = fk.pids(PIDS, "then_kills_worker")
    assert pids and not any(map(fk.alive, pids))


def test_wrong_slots_of_a_forking_kernel_are_no_pass():
    with pytest.raises(AssertionError, match="matches-reference"):
        check_kernel("{FORKS}:wrong_daemon", scenarios=["mtp"])
'''


def test_nothing_a_kernel_forks_outlives_the_pytest_run(pytester, monkeypatch):
    """The plugin's process is the user's and never a subreaper; still, a kernel's child in a session
    of its own ends: below a live worker (a double-forked daemon of the generated item: at exit), with
    a worker stopped on a timeout, and after its worker was SIGKILLed by the kernel (the marker sweep
    when the check ends). Afterwards no process started by the run is alive (checked by marker)."""
    import time
    import uuid
    from test_hostile_kernel import _marked
    from test_isolation import _forks
    fk = _forks()
    pids, mark = pytester.path / "pids", f"cpsim-plugin-{uuid.uuid4().hex}"
    monkeypatch.setenv("CPSIM_TEST_PIDS", str(pids))
    monkeypatch.setenv("CPSIM_TEST_MARK", mark)
    monkeypatch.setenv("CPSIM_KERNEL_WORKERS", "1")
    pytester.makepyfile(test_user=USER_TESTS)
    try:
        res = pytester.runpytest_subprocess("--cpsim-kernel-v1", f"{FORKS}:daemon", "--cpsim-scenarios", "mtp",
                                            "-p", "cpsim.plugin.testing", "-p", "no:warnings", timeout=600)
        res.assert_outcomes(passed=4)
        assert {line.split()[0] for line in pids.read_text().splitlines()} == {
            "daemon", "then_hangs", "then_kills_worker", "wrong_daemon"}
        end = time.monotonic() + 10  # SIGKILL is delivered asynchronously
        while time.monotonic() < end and (_marked(mark) or any(map(fk.alive, fk.pids(pids)))):
            time.sleep(0.1)
        assert [p for p in fk.pids(pids) if fk.alive(p)] == []
        assert _marked(mark) == []
    finally:
        for pid in set(fk.pids(pids) + _marked(mark)):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

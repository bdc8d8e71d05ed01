"""`cpsim --help`, `--version`, every sub-command's `--help` and the input errors decided before any
kernel runs answer without importing torch or Triton (seconds each on a loaded box).

One child process runs the CLI on every case in turn and reports, after each, its exit code and
whether torch or Triton is in ``sys.modules``; the control case (a command that loads its module)
shows the probe sees torch when it is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# (argv, exit code): what answers without torch.
LIGHT = [
    (["--help"], 0),
    (["--version"], 0),
    *[([*cmd.split(), "--help"], 0) for cmd in ("run", "sweep", "draw", "fuzz", "replay", "bugs", "bugs list",
                                                "bugs show", "bugs reproduce", "bugs matrix", "doctor",
                                                "ascend-check")],
    (["run", "--bogus"], 2),                              # argparse
    (["run", "--dcp", "0"], 2),                           # option bounds (validate.check_args)
    (["run", "--timeout", "-1"], 2),
    (["run", "--json", "/nonexistent-cpsim-dir/r.json"], 2),  # an output that cannot be written
    (["run", "--scenario", "nope"], 2),                   # the scenario (cmd.inputs.check_run_inputs)
    (["run", "--scenario", "/nonexistent-cpsim-dir/s.json"], 2),
    (["run", "--dcp", "3", "--interleave", "0"], 2),
    (["run", "--paths", "v9"], 2),                        # the paths
    (["run", "--paths", "v1-fused"], 2),                  # a path that runs on nothing of the scenario
    (["run", "--inject-on-rank", "1"], 2),
    (["run", "--profile", "nope"], 2),
    (["run", "--paths", "v2", "--kernel-v2", "/nonexistent-cpsim-dir/k.py:kernel"], 2),  # no such kernel file
    (["run", "--paths", "v1", "--kernel-v2", "k.py:kernel"], 2),          # a kernel for a path not selected
    (["run", "--kernel-v1", "not-a-spec"], 2),
    (["fuzz", "--jobs", "0"], 2),                         # cmd.inputs.check_fuzz_inputs
    (["fuzz", "--max-examples", "0"], 2),
    (["fuzz", "--paths", "v1,,v2"], 2),
    (["fuzz", "--kernel-v1", "/nonexistent-cpsim-dir/k.py:kernel"], 2),
]

PROBE = r"""
import json, sys
from cpsim import cli
out = []
for argv in json.loads(sys.argv[1]):
    code = cli.main(argv)
    out.append([code, "torch" in sys.modules, "triton" in sys.modules])
print("PROBE " + json.dumps(out))
"""


def probe(cases: list[list[str]]) -> list[tuple[int, bool, bool]]:
    """(exit code, torch loaded, Triton loaded) after each case, in one child process, in order."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [tuple(x) for x in json.loads(line[-1][len("PROBE "):])]


def test_help_version_and_input_errors_answer_without_torch_or_triton():
    got = probe([argv for argv, _ in LIGHT])
    for (argv, code), (rc, torch, triton) in zip(LIGHT, got, strict=True):
        assert rc == code, f"cpsim {' '.join(argv)}: exit {rc}, expected {code}"
        assert not torch and not triton, f"cpsim {' '.join(argv)} imported {'torch' if torch else 'Triton'}"


@pytest.mark.parametrize("control", [["bugs", "list"]])
def test_the_probe_sees_torch_once_a_command_module_loads(control):
    """The control: a command that runs loads its module, which imports torch; the probe reports it."""
    ((rc, torch, _),) = probe([control])
    assert rc == 0 and torch


def test_every_command_is_run_by_a_module_function_that_exists():
    """Each parser's ``func`` names ``module:function`` (loaded only when it runs): every one resolves."""
    import argparse

    from cpsim.cli import build_parser, command

    def leaves(p):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield p
        for a in subs:
            for q in dict.fromkeys(a.choices.values()):
                yield from leaves(q)

    funcs = {leaf.get_default("func") for leaf in leaves(build_parser())}
    assert len(funcs) >= 11 and all(isinstance(f, str) and ":" in f for f in funcs)
    assert all(callable(command(f)) for f in funcs)


HEAD_START = r"""
import json, subprocess, sys
from cpsim import cli
started = []
class Popen(subprocess.Popen):
    def __init__(self, args, *rest, **kw):
        if any("cpsim.run.kernel_worker" in str(a) for a in args):  # a kernel worker's start
            started.append("torch" in sys.modules)
        super().__init__(args, *rest, **kw)
subprocess.Popen = Popen
code = cli.main(json.loads(sys.argv[1]))
print("STARTS " + json.dumps([code, started]))
"""


def test_run_starts_its_kernel_workers_before_it_imports_torch():
    """`cpsim run` with a user's kernel: both workers of its pool start before this process imports torch
    (each imports torch and cpsim on the other core meanwhile), and the probe and every path run in them:
    no worker is started once torch is in."""
    argv = ["run", "--scenario", "default", "--dcp", "4", "--paths", "v1,v2", "--kernel-v1",
            "examples/my_slots.py:my_slots", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CPSIM_KERNEL_WORKERS": "2"}
    proc = subprocess.run([sys.executable, "-c", HEAD_START, json.dumps(argv)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("STARTS ")]
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-2000:]
    code, started = json.loads(line[-1][len("STARTS "):])
    assert code == 0 and "pass" in proc.stdout
    assert started == [False, False], f"worker starts (torch already imported?): {started}"

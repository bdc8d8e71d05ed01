"""The options the sub-commands share: scenario, paths, kernels under test, profile and sizing, the
printed report, devices and torchrun, ``--stack``.

Everything here is read before torch or Triton is imported (``cpsim --help`` and every usage error
answer without them), so it imports only the light modules that hold the names and defaults.
"""

from __future__ import annotations

import argparse

from cpsim.check import profiles
from cpsim.kernels.under_test import ABIS, V2_LAUNCHES
from cpsim.presets import PRESETS
from cpsim.report.terminal import DEFAULT_EXAMPLES
from cpsim.run.host_sizer import TIMEOUT_S
from cpsim.run.torchrun_env import DEFAULT_TIMEOUT_S, DEVICES
from cpsim.schema import PATH_NAMES as PATHS
from cpsim.stack import FAMILIES


def add_scenario_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scenario")
    g.add_argument("--scenario", default="default", metavar="NAME|FILE",
                   help=f"preset ({', '.join(PRESETS)}) or a .json/.toml file (default: default)")
    g.add_argument("--dcp", type=int, help="decode context-parallel size (overrides the scenario)")
    g.add_argument("--pcp", type=int, help="prefill context-parallel size (overrides the scenario)")
    g.add_argument("--interleave", type=int, help="CP KV-cache interleave size (overrides the scenario)")
    g.add_argument("--seed", type=int, default=0, help="seed for the preset's batch and the allocator")
    g.add_argument("--allow-invalid", action="store_true",
                   help="run CP layouts that break the global owner rule, to see what breaks")
    g.add_argument("--allow-large", action="store_true",
                   help="run a CP world size above 64 in the virtual world (every rank in turn: minutes)")


class DefaultPaths(str):
    """--paths when the user did not give it: paths that do not apply are skipped quietly then."""


def add_path_args(p: argparse.ArgumentParser, default: str = ",".join(PATHS)) -> None:
    p.add_argument("--paths", default=DefaultPaths(default),
                   help=f"comma-separated paths to run, from {','.join(PATHS)} (default: {default})")


# ---- kernel under test -------------------------------------------------------

KERNEL_FLAGS = {"v1": "kernel_v1", "v1-fused": "kernel_v1_fused", "v2": "kernel_v2"}


def add_kernel_args(p: argparse.ArgumentParser) -> None:
    """``--kernel-v1/--kernel-v1-fused/--kernel-v2 SPEC``: the user's kernel replaces the built-in one."""
    g = p.add_argument_group("kernel under test",
                             "SPEC is package.module:attr or path/to/file.py:attr; "
                             "'vllm' or 'ascend' (v1, v2) imports the installed release's kernel; "
                             "'builtin' is cpsim's own")
    g.add_argument("--kernel-v1", metavar="SPEC", help="kernel for the v1 path (vllm-ascend BlockTable)")
    g.add_argument("--kernel-v1-fused", metavar="SPEC", help="kernel for the v1-fused path (CP size 1 only)")
    g.add_argument("--kernel-v2", metavar="SPEC", help="kernel for the v2 path (vLLM BlockTables)")
    g.add_argument("--kernel-replay", metavar="SPEC",
                   help="prefix-cache replay-padding kernel run after every path's slot mapping "
                        "(vLLM _pad_replayed_slots_kernel signature)")
    g.add_argument("--kernel-abi", default="auto", choices=("auto", *ABIS),
                   help="calling convention (default: auto, from the kernel's parameter names)")
    g.add_argument("--kernel-v2-launch", default="split", choices=V2_LAUNCHES,
                   help="v2 ABIs have one CP size per launch: 'split' launches unsharded groups with CP_SIZE=1, "
                        "'single' launches every group with the CP size, as the runtime does (default: split)")
    g.add_argument("--shim-vllm", action="store_true",
                   help="provide vllm.triton_utils and _load_ptr from Triton so a kernel file loads without vLLM")
    g.add_argument("--kernel-timeout", type=float, metavar="SECONDS",
                   help="wall-clock bound of one rank's run of a path; kernels run in a worker process, and one "
                        "that raises, crashes, hangs past this or exits is a violation (default: --timeout, else 300; "
                        "under torchrun 3/4 of --timeout, so the report gets the failure before the peers' bound)")


def add_profile_arg(p: argparse.ArgumentParser, strict_sizing: bool = True) -> None:
    """``--profile NAME``, ``--sizing SPEC`` and ``--sizing-timeout`` (every command that judges);
    ``--strict-sizing`` (``run``)."""
    p.add_argument("--profile", metavar="NAME",
                   help=f"the runtime contract the oracle judges by ({', '.join(profiles.PROFILES)}; default: the "
                        f"loaded kernel's release (a repro's recorded one), else the --sizing release, builtin = "
                        f"cpsim; docs/SPEC.md §4.1)")
    if strict_sizing:
        p.add_argument("--strict-sizing", action="store_true",
                       help="also note tables wider and slot buffers larger than the profile's rule (waste; exit 0)")
    p.add_argument("--sizing", metavar="SPEC",
                   help="host sizing under test: table widths and slot-buffer length from a built-in release "
                        "(cpsim, vllm-0.33, vllm-ascend-0.23) or your function, path/to/file.py:fn or "
                        "package.module:fn, asked for every scenario (run in a child process; a repro's recorded "
                        "one unless this replaces it; docs/TESTING_YOUR_KERNEL.md §Host sizing)")
    p.add_argument("--sizing-timeout", type=float, default=TIMEOUT_S, metavar="SECONDS",
                   help=f"bound on the sizing function's answer for one scenario (default {TIMEOUT_S:g})")


def _examples(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"--examples must be an integer >= 0, got {text!r}")
    return n


def add_report_args(p: argparse.ArgumentParser) -> None:
    """Options of the printed report."""
    p.add_argument("--examples", type=_examples, default=DEFAULT_EXAMPLES, metavar="N",
                   help=f"examples printed per failing invariant, paths that agree printed once "
                        f"(default: {DEFAULT_EXAMPLES}; --json has them all)")


def add_dist_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("devices and torchrun")
    g.add_argument("--device", choices=DEVICES, default="auto",
                   help="where kernels run: auto picks npu, then cuda, then cpu (default: auto)")
    g.add_argument("--oversubscribe", action="store_true",
                   help="allow more ranks than devices on a node: kernels share the devices, "
                        "collectives go through gloo on host copies")
    g.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"bound on process-group init and on every collective (default: {DEFAULT_TIMEOUT_S:g})")


STACK_COMMAND = "cpsim.cmd.stack_run:main"


class _StackFamily(argparse.Action):
    """``--stack FAMILY`` makes ``cpsim run`` another program: the release's host classes are driven instead of
    kernels, so the command that runs is :func:`cpsim.cmd.stack_run.main`, not ``cmd.run``'s kernel run."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        namespace.stack = value
        namespace.func = STACK_COMMAND


def add_stack_args(p) -> None:
    p.add_argument("--stack", metavar="FAMILY", choices=sorted(FAMILIES), action=_StackFamily,
                   help="drive the installed release's host block-table classes per CP rank "
                        f"({', '.join(sorted(FAMILIES))}) instead of cpsim's paths")
    p.add_argument("--stack-python", metavar="PY", help="the side venv's python that has the release "
                                                       "(default: $CPSIM_STACK_PYTHON, else this python)")
    p.add_argument("--stack-classes", metavar="FILE", help="host classes of your own in the release's shape, "
                                                          "driven instead of the installed ones")
    p.add_argument("--stack-source", metavar="DIR[:DIR...]", help="unpacked releases (an sdist's top folder, a "
                   "--target folder) put first on the child's sys.path, in order: vllm-ascend without installing "
                   "it, e.g. SDIST:VLLM_FOLDER for the vLLM it was built for")


HTML_REPORT = "write a self-contained HTML report (with the picture when the scenario is small enough to draw)"


def add_output_args(p: argparse.ArgumentParser, json: str = "", html: str = "", junit: str = "",
                    quiet: str = "") -> None:
    """The report files a command writes (``--json/--html/--junit FILE``) and ``--quiet``, in one place: each
    help text given adds its option (``validate.check_args`` probes every output path before any work)."""
    for flag, text in (("--json", json), ("--html", html), ("--junit", junit)):
        if text:
            p.add_argument(flag, metavar="FILE", help=text)
    if quiet:
        p.add_argument("--quiet", action="store_true", help=quiet)

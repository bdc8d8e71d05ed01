"""The sub-commands' grammar: each one's options and description, and the function that runs it, named
as ``module:function`` and imported only when that command runs (``cpsim.cli``).

Nothing here imports torch or Triton: ``cpsim --help``, a sub-command's ``--help`` and every usage error
answer in a fraction of a second. A command's description is its module's docstring, read from the
source for the same reason.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
from pathlib import Path

from cpsim import fuzz as fz
from cpsim.cmd.inputs import check_fuzz_inputs, check_run_inputs
from cpsim.cmd.options import (HTML_REPORT, DefaultPaths, add_dist_args, add_kernel_args, add_output_args,
                               add_path_args, add_profile_arg, add_report_args, add_scenario_args, add_stack_args)
from cpsim.kernels.under_test import ABIS
from cpsim.presets import PRESETS
from cpsim.schema import KERNEL_DESIGNS
from cpsim.schema import PATH_NAMES as PATHS

KEYS = ("presets", "cp", "interleaves", "paths", "seed")  # a sweep --config's keys


def _doc(command: str) -> str:
    """The docstring of ``cpsim.cmd.<command>``, read without importing the module (which imports torch)."""
    origin = importlib.util.find_spec(f"cpsim.cmd.{command}").origin
    return ast.get_docstring(ast.parse(Path(origin).read_text()), clean=False) or ""


def run(sub) -> None:
    p = sub.add_parser("run", help="check one scenario on every CP rank (virtual world or torchrun)",
                       description=_doc("run"), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scenario_args(p)
    add_path_args(p)
    add_kernel_args(p)
    add_profile_arg(p)
    add_dist_args(p)
    add_output_args(p, json="write the full report as JSON (docs/REPORT_SCHEMA.md)",
                       html=HTML_REPORT,
                       junit="write JUnit XML: one testcase per path, group and invariant",
                       quiet="print only the verdict line; no progress bar")
    add_report_args(p)
    p.add_argument("--kernel-design", choices=KERNEL_DESIGNS, default="per-request",
                   help="built-in Triton kernels: per-request (vllm-ascend-faithful) or tile (tile-parallel)")
    p.add_argument("--inject", metavar="NAME", help="inject a catalogue fault (see `cpsim bugs list`)")
    p.add_argument("--inject-on-rank", type=int, metavar="R", help="inject it on CP rank R only")
    add_stack_args(p)
    p.set_defaults(func="cpsim.cmd.run:main", check_inputs=check_run_inputs)


def sweep(sub) -> None:
    p = sub.add_parser("sweep", help="run a matrix of scenarios x CP sizes x paths, one report",
                       description=_doc("sweep"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="TOML file with the matrix (keys: " + ", ".join(KEYS) + ")")
    p.add_argument("--presets", help="comma-separated presets or scenario files; 'all' = every preset "
                                     "(default: default)")
    p.add_argument("--cp", help="comma-separated CP sizes, N or DxP (default: each preset's own)")
    p.add_argument("--interleaves", help="comma-separated interleave sizes (default: each preset's own)")
    p.add_argument("--paths", help="comma-separated paths (default: all)")
    p.add_argument("--seed", type=int, help="base seed (replica g of a torchrun job uses seed + g; default 0)")
    p.add_argument("--allow-large", action="store_true",
                   help="run CP world sizes above 64 in the virtual world (every rank in turn: minutes)")
    add_kernel_args(p)
    add_profile_arg(p, strict_sizing=False)
    add_dist_args(p)
    add_output_args(p, json="write the whole report as JSON",
                       html=("write one self-contained HTML page with every scenario's invariant table and "
                             "violations"),
                       junit="write JUnit XML: one testcase per (scenario, path, invariant)",
                       quiet="no progress bar, only the summary")
    add_report_args(p)
    p.set_defaults(func="cpsim.cmd.sweep:main")


def draw(sub) -> None:
    p = sub.add_parser("draw", help="draw who owns each token and where it lands (PNG/SVG)",
                       description="Draw one scenario's CP layout: token owners per request, each rank's "
                                   "blocks slot by slot, violations outlined in red and named.")
    add_scenario_args(p)
    add_path_args(p)
    # None = "not given", so --inject can fall back to the fault's own scenario.
    p.set_defaults(scenario=None, paths="v1,v2")
    p.add_argument("--repro", metavar="FILE", help="draw the scenario (and knobs, if any) of a repro file")
    p.add_argument("--inject", metavar="NAME", help="inject a catalogued fault (cpsim.faults); uses the fault's "
                                                     "own scenario unless --scenario or --repro is given")
    p.add_argument("--capture", metavar="PATH", help="draw a captured step (capture dir/file or explicit batch; "
                                                      "docs/CAPTURE.md): the first failing one unless --step")
    p.add_argument("--step", type=int, metavar="N", help="with --capture: the step to draw")
    p.add_argument("--out", required=True, metavar="FILE.png|FILE.svg", help="where to write the picture")
    p.add_argument("--title", default="", help="figure title (default: scenario summary)")
    add_output_args(p, quiet="print nothing on success")
    add_kernel_args(p)  # the same kernels as `run`; a repro's recorded kernels unless these replace them
    add_profile_arg(p, strict_sizing=False)  # a repro's recorded profile and sizing unless these replace them
    p.set_defaults(func="cpsim.cmd.draw:main")


def fuzz(sub) -> None:
    p = sub.add_parser("fuzz", help="search random scenarios for violations; shrink each distinct one; write repros",
                       description=_doc("fuzz"), formatter_class=argparse.RawDescriptionHelpFormatter)
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--max-examples", type=int, default=300, metavar="N",
                        help="scenarios to run, search and shrink together, all jobs together (default: 300)")
    budget.add_argument("--minutes", type=float, metavar="M",
                        help="keep searching in rounds of 100 examples until M minutes have passed")
    p.add_argument("--seed", type=int, help="the same seed draws the same scenarios; the example database is then "
                                            "neither read nor written (default: random, database on). Shrinking is "
                                            "seeded too with --explore hypothesis only")
    add_path_args(p, default=",".join(fz.DEFAULT_PATHS))
    p.add_argument("--inject", metavar="NAME", help="inject a catalogue fault (see `cpsim fuzz --list-faults`)")
    p.add_argument("--list-faults", action="store_true", help="print the fault names --inject accepts and exit")
    add_kernel_args(p)  # recorded in the repro file, so `cpsim replay` loads the same kernels
    add_profile_arg(p, strict_sizing=False)  # profile and --sizing recorded in the repro file too; replay uses them
    p.add_argument("--allow-invalid", action="store_true",
                   help="also draw CP layouts that break the global owner rule (interleave not dividing B)")
    p.add_argument("--extreme", action="store_true",
                   help="also draw integer-boundary caches: kernel-block ids up to 2^31 - 1, slots past 2^31 "
                        "(default space: kernel-block ids up to 2^26; slot ids past 2^31 only where every kernel "
                        "under test writes int64 slots)")
    p.add_argument("--stop-after-first", action="store_true",
                   help="stop at the first violation and shrink only it (one repro)")
    p.add_argument("--ignore", action="append", default=[], metavar="SIGNATURE",
                   help="do not report this signature (path:kind:invariants:dimension, globs allowed); repeatable")
    p.add_argument("--known", metavar="FILE",
                   help="signatures already triaged, one a line (# comments), or a fuzz-summary.json")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="worker processes (CPU only), each its own seed stream, one shared example database")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "npu"),
                   help="where the kernels run (the checks stay on the host); repro files replay on CPU too")
    p.add_argument("--explore", default="random", choices=fz.EXPLORERS,
                   help="how scenarios are drawn: random (default: plain random draws, ~0.2 ms a scenario, each new "
                        "failure handed to Hypothesis to shrink) or hypothesis (Hypothesis draws them too, ~3 ms); "
                        "both draw from one definition of the space")
    p.add_argument("--out", default="out", metavar="DIR",
                   help="where repro-<fingerprint>.json and fuzz-summary.json go (default: out)")
    p.add_argument("--db", default=str(fz.DEFAULT_DB), metavar="DIR",
                   help="Hypothesis example database, one subdirectory per configuration (paths, kernels, fault, "
                        "space), so a rerun starts from known failures (default: .cpsim/hypothesis)")
    p.add_argument("--no-db", action="store_true", help="do not read or write the example database")
    p.add_argument("--max-programs", type=int, default=48, metavar="P",
                   help="bound on CP world x groups x (requests + 1), the interpreter programs one path "
                        "launches per scenario; larger worlds get fewer requests (default 48)")
    p.add_argument("--shrink-seconds", type=float, default=60.0, metavar="S",
                   help="time each search round may spend shrinking (default 60); as much again goes to "
                        "lowering the findings' cache sizes at the end")
    add_output_args(p, quiet="no progress display, no per-signature report")
    p.set_defaults(func="cpsim.cmd.fuzz:main", check_inputs=check_fuzz_inputs)


def replay(sub) -> None:
    p = sub.add_parser("replay", help="rerun a fuzz repro (virtual world or torchrun), a capture or an explicit batch",
                       description=_doc("replay"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", help="repro-<fingerprint>.json, a capture (directory of rank*.cpcap, "
                                                "docs/CAPTURE.md) or an explicit batch (.npz/.json)")
    p.add_argument("--accept-edited", action="store_true",
                   help="replay a repro whose scenario was edited (its fingerprint no longer matches)")
    p.add_argument("--allow-large", action="store_true",
                   help="replay a CP world size above 64 in the virtual world (every rank in turn: minutes)")
    add_kernel_args(p)
    add_profile_arg(p, strict_sizing=False)
    add_dist_args(p)
    add_output_args(p, json="write the report and the violation summary as JSON",
                       html=HTML_REPORT,
                       quiet="print only the verdict line")
    add_report_args(p)
    p.add_argument("--shrink", metavar="OUT", help="capture/explicit batch: write the smallest explicit batch "
                                                    "that still fails the first failing step to OUT (.npz/.json)")
    p.set_defaults(func="cpsim.cmd.replay:main")


def bugs(sub) -> None:
    p = sub.add_parser("bugs", help="the catalogue of real CP slot-mapping bugs: list, show, reproduce, matrix")
    bsub = p.add_subparsers(dest="bugs_command", required=True, metavar="ACTION")

    q = bsub.add_parser("list", help="every catalogue entry: paths, invariants, references")
    q.add_argument("--markdown", action="store_true", help="print a Markdown table (as in docs/BUGS.md)")
    q.set_defaults(func="cpsim.cmd.bugs:main_list")

    q = bsub.add_parser("show", help="one entry: explanation, triggering scenario, expected violation")
    q.add_argument("name", help="fault name (see `cpsim bugs list`)")
    q.add_argument("--dump", metavar="FILE", help="write the triggering scenario (.json/.toml) for `cpsim run`")
    q.set_defaults(func="cpsim.cmd.bugs:main_show")

    q = bsub.add_parser("reproduce", help="run the triggering scenario with the fault (exit 1 when it shows)")
    q.add_argument("name", help="fault name (see `cpsim bugs list`)")
    q.add_argument("--fixed", action="store_true", help="run the fixed form instead (exit 0 when clean)")
    q.add_argument("--paths", default=DefaultPaths(",".join(PATHS)), help=f"paths to run (default: {','.join(PATHS)})")
    q.add_argument("--inject-on-rank", type=int, metavar="R", help="inject the fault on CP rank R only")
    add_kernel_args(q)
    add_profile_arg(q, strict_sizing=False)
    add_dist_args(q)
    add_output_args(q, json="write the full report as JSON",
                       html=HTML_REPORT)
    add_report_args(q)
    q.set_defaults(func="cpsim.cmd.bugs:main_reproduce")

    q = bsub.add_parser("matrix", help="every fault against its trigger and the presets; catch rate last")
    q.add_argument("--presets", default=",".join(PRESETS),
                   help=f"comma-separated presets, or 'none' (default: {','.join(PRESETS)})")
    q.add_argument("--faults", help="comma-separated fault names (default: all)")
    q.add_argument("--seed", type=int, default=0, help="seed for the presets")
    q.add_argument("--jobs", type=int, default=0, help="worker processes (default: CPU count, at most 8)")
    q.add_argument("--markdown", action="store_true", help="print the matrix as a Markdown table")
    add_output_args(q, json="write the matrix as JSON")
    add_kernel_args(q)
    q.set_defaults(func="cpsim.cmd.bugs:main_matrix")


def doctor(sub) -> None:
    p = sub.add_parser("doctor", help="check this machine: versions, devices, backend, every built-in kernel",
                       description=_doc("doctor").split("\n\nTest hook")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dist_args(p)
    add_output_args(p, json="write every row (and each rank's device) as JSON")
    p.add_argument("--skip-kernels", action="store_true", help="only the environment: no kernel launches")
    p.set_defaults(func="cpsim.cmd.doctor:main")


def ascend_check(sub) -> None:
    p = sub.add_parser("ascend-check", help="compile kernels for Ascend offline (triton-ascend, first lowering stage)",
                       description=_doc("ascend_check"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel-v1", metavar="SPEC", help="your v1 kernel (package.module:attr or file.py:attr)")
    p.add_argument("--kernel-v1-fused", metavar="SPEC", help="your v1-fused kernel")
    p.add_argument("--kernel-v2", metavar="SPEC", help="your v2 kernel")
    p.add_argument("--kernel-replay", metavar="SPEC", help="your prefix-cache replay-padding kernel")
    p.add_argument("--kernel-abi", default="auto", choices=("auto", *ABIS),
                   help="calling convention (default: auto, from the kernel's parameter names)")
    p.add_argument("--shim-vllm", action="store_true", help="load a kernel file that imports vllm.triton_utils")
    p.add_argument("--builtin", action="store_true", help="also check the built-in kernels when --kernel-* is given")
    p.add_argument("--only", metavar="NAME", action="append", help="built-in kernel(s) to check (default: all)")
    p.add_argument("--arch", default="Ascend910B3", help="target passed to GPUTarget('npu', ARCH, 0)")
    p.add_argument("--ascend-python", metavar="PY", help="interpreter with triton-ascend (default: .venv-ascend)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes (default: CPU count)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds for the whole check (default 3600)")
    add_output_args(p, json="every compilation's result as JSON")
    p.set_defaults(func="cpsim.cmd.ascend_check:main")


COMMANDS = (run, sweep, draw, fuzz, replay, bugs, doctor, ascend_check)

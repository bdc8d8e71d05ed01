"""``cpsim run --stack FAMILY``: judge the installed runtime's own host block-table classes.

The release's code runs in a child of ``--stack-python`` (or $CPSIM_STACK_PYTHON), a side
venv with the release installed (docs/UPSTREAM.md); this process judges what it sends back.
"""

from __future__ import annotations

from rich.console import Console

from cpsim.check import coordinator
from cpsim.cmd import DefaultPaths, parse_paths, scenario_from_args
from cpsim.errors import ConfigError
from cpsim.report import report
from cpsim.stack import FAMILIES

# v1: the release's per-group BlockTable (MultiGroupBlockTable); v2: its MRV2 BlockTables.
STACK_PATHS = ("v1", "v2")


def add_stack_args(p) -> None:
    p.add_argument("--stack", metavar="FAMILY", choices=sorted(FAMILIES),
                   help="drive the installed release's host block-table classes per CP rank "
                        f"({', '.join(sorted(FAMILIES))}) instead of cpsim's paths")
    p.add_argument("--stack-python", metavar="PY", help="the side venv's python that has the release "
                                                       "(default: $CPSIM_STACK_PYTHON, else this python)")
    p.add_argument("--stack-classes", metavar="FILE", help="host classes of your own in the release's shape, "
                                                          "driven instead of the installed ones")
    p.add_argument("--stack-source", metavar="DIR[:DIR...]", help="unpacked releases (an sdist's top folder, a "
                   "--target folder) put first on the child's sys.path, in order: vllm-ascend without installing "
                   "it, e.g. SDIST:VLLM_FOLDER for the vLLM it was built for")


def main_stack(args) -> int:
    from cpsim.stack import host
    s = scenario_from_args(args)
    paths = ["v1", "v2"] if isinstance(args.paths, DefaultPaths) else parse_paths(args.paths)
    bad = [p for p in paths if p not in STACK_PATHS]
    if bad:
        raise ConfigError("--paths", f"with --stack the paths are the runtime's host classes: "
                                     f"{', '.join(STACK_PATHS)} (got {', '.join(bad)})")
    console = Console()
    try:
        result = host.judge(host.drive(s, args.stack, paths, args.stack_python, args.stack_classes,
                                       source=args.stack_source), getattr(args, "profile", None))
    except RuntimeError as e:  # the release's code died or hung: never a pass
        console.print(f"[bold red]FAIL[/bold red] {e}", highlight=False, soft_wrap=True)
        return 1
    verdicts = result.verdicts
    if args.quiet:
        console.print("pass" if coordinator.passed(verdicts) else "FAIL")
    else:
        report.print_report(console, result.scenario, verdicts, title=f"{s.name} on {result.release} host classes")
        console.print(f"stack: {result.release}; profile: {result.profile or 'cpsim'}; patches:", highlight=False)
        for line in result.patches:
            console.print(f"  - {line}", highlight=False, soft_wrap=True)
    if args.json:
        report.write_json(args.json, report.to_dict(result.scenario, verdicts,
                                                    {"stack": {"release": result.release,
                                                               "profile": result.profile or "cpsim",
                                                               "patches": result.patches}}))
    return 0 if coordinator.passed(verdicts) else 1

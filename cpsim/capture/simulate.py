"""A multi-step virtual world run under capture: a stand-in serving process for demos and tests.

Each scenario is one step; every rank of the CP group runs the chosen paths in
turn (as ``cpsim run`` does), and every real Triton launch is recorded through
:mod:`cpsim.capture` into one file per rank. A fault can be injected on one rank.

    python -m cpsim.capture.simulate OUT_DIR [--preset default] [--steps 3] [--inject stale-tail --inject-on-rank 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cpsim import capture as cap
from cpsim.allocator import allocate_rank
from cpsim.paths import Knobs, run_path
from cpsim.run.world import knobs_for
from cpsim.errors import ConfigError
from cpsim.presets import preset
from cpsim.scenario import Scenario, validate
from cpsim.validate import load_scenario


def run(scenarios: list[Scenario], directory: str | Path, paths=("v1", "v2"), knobs: Knobs = Knobs(),
        inject_rank: int | None = None, fault_steps: set[int] | None = None, meta: dict | None = None,
        device: str = "cpu", **policy) -> cap.Recorder:
    """Run ``scenarios`` (one step each) on every rank under capture; the fault only on ``fault_steps`` if given.

    ``policy``: ``every``, ``steps`` (``"a..b"``), ``budget`` as for :func:`cpsim.capture.capture`.
    """
    with cap.capture(directory, meta=meta, **policy) as rec:
        for n, s in enumerate(scenarios):
            k = knobs if fault_steps is None or n in fault_steps else Knobs(kernel_design=knobs.kernel_design)
            for r in range(s.cp.world):
                allocs = allocate_rank(s, r)
                with rec.step(n, rank=r):
                    for path in paths:
                        run_path(path, s, allocs, r, device, knobs_for(r, k, inject_rank))
    return rec


def main(argv: list[str] | None = None) -> int:
    from cpsim import faults

    p = argparse.ArgumentParser(prog="python -m cpsim.capture.simulate", description=__doc__.splitlines()[0])
    p.add_argument("out", metavar="OUT_DIR")
    p.add_argument("--preset", default="default")
    p.add_argument("--scenario", help="a scenario file instead of a preset (a repro's scenario works)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--paths", default="v1,v2")
    p.add_argument("--inject", help="fault name from the catalogue (`cpsim bugs`)")
    p.add_argument("--inject-on-rank", type=int)
    p.add_argument("--inject-at-step", type=int, help="only this step runs with the fault")
    args = p.parse_args(argv)
    try:
        base = load_scenario(args.scenario) if args.scenario else validate(preset(args.preset))
        steps = [base.replace(seed=base.seed + i) for i in range(args.steps)]
        knobs = faults.get(args.inject, "--inject").knobs_for(base) if args.inject else Knobs()
        at = {args.inject_at_step} if args.inject_at_step is not None else None
        rec = run(steps, args.out, tuple(args.paths.split(",")), knobs, args.inject_on_rank, at)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{rec.records} launch(es) of {rec.launches} recorded into {args.out} ({rec.bytes} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

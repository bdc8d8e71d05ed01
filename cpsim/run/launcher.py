"""torchrun for the launch scripts: the same launcher, ending in one line instead of a traceback.

torchrun ends a failed job with a ``ChildFailedError`` traceback (about 40 lines) and exit 1
whatever its workers' codes were, so "bad input" (2) and "violation" (1) look alike and the
report scrolls away. ``python -m cpsim.run.launcher [torchrun options] -m cpsim ...`` runs
torchrun's own ``run`` in this process with its log (the agent's messages and the failure
summary) written to ``<log-dir>/torchrun.log`` and the workers' error files under
``<log-dir>``; a non-zero ending is one line on stderr naming the ranks and that directory,
and the exit code is the workers' (they agree on it by collective, see ``cpsim.run.dist``).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from types import MappingProxyType

from cpsim.releases import UNREAD_CHANGES_EXIT

EXIT_MEANING = MappingProxyType({
    0: "pass", 1: "a violation or a failed run, see above", 2: "bad input",
    UNREAD_CHANGES_EXIT: "no violation, but a kernel's release has unread contract changes, see above"})
REPORT = "report: "  # cpsim.run.distrun.HEADLINE: the message rank 0 leaves when its report fails


@dataclass(frozen=True)
class Ending:
    rank: int
    exitcode: int
    message: str = ""     # the error file's message, when the rank wrote one
    timestamp: float = 0


def _signame(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _ranks(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def exit_code(endings: list[Ending]) -> int:
    """The job's code: 2 when the ranks ended on bad input, UNREAD_CHANGES_EXIT when they found no
    violation in a kernel judged with the nearest listed release's changed contract (some maybe
    stopped by the launcher's SIGTERM on the way), otherwise 1 (a violation, a failed run, a rank
    killed by a signal)."""
    codes = {e.exitcode for e in endings}
    for code in (2, UNREAD_CHANGES_EXIT):
        if code in codes and codes <= {code, -signal.SIGTERM}:
            return code
    return 1


def summary(endings: list[Ending], world: int | None, log_dir: str) -> str:
    """One line: what the non-zero exit means, which ranks ended how, where torchrun's logs are."""
    code = exit_code(endings)
    by: dict[int, list[int]] = {}
    for e in endings:
        by.setdefault(e.exitcode, []).append(e.rank)
    parts = []
    for c in sorted(by, key=lambda c: (c < 0, c)):
        rs = _ranks(by[c])
        parts.append(f"{rs} stopped by {_signame(c)}" if c < 0 else f"{rs} exited {c}")
    of = f" (of {world} ranks)" if world and len(endings) < world else ""
    text = "; ".join(parts) + of
    msgs = [e for e in endings if e.message and e.exitcode not in (0, 2)]
    if msgs:
        first = min(msgs, key=lambda e: (e.timestamp, e.rank))
        line = first.message.strip().splitlines()[0]
        # Rank 0's report (cpsim.run.distrun.headline) speaks for the job, not for rank 0.
        text += f"; {_clip(line[len(REPORT):])}" if line.startswith(REPORT) else f"; rank {first.rank}: {_clip(line)}"
    return f"cpsim: exit {code} ({EXIT_MEANING[code]}): {text}; torchrun's logs: {log_dir}"


def _clip(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _log_to(path: str) -> None:
    """Send torch.distributed's log records (the agent's) to ``path`` instead of stderr."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("torch.distributed", "torch.distributed.elastic", "torch.distributed.run"):
        lg = logging.getLogger(name)
        lg.handlers = [handler]
        lg.propagate = False
        lg.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(argv)
    if not args.log_dir:
        args.log_dir = tempfile.mkdtemp(prefix=time.strftime("cpsim-torchrun-%Y%m%d-%H%M%S-"))
    os.makedirs(args.log_dir, exist_ok=True)
    log = os.path.join(args.log_dir, "torchrun.log")
    _log_to(log)
    try:
        torchrun.run(args)
    except ChildFailedError as e:
        logging.getLogger("torch.distributed.run").error("%s: %s", type(e).__name__, e.format_msg())
        endings = [Ending(r, f.exitcode, _message(f), f.timestamp) for r, f in e.failures.items()]
        world = None
        nnodes = str(args.nnodes)
        if nnodes.isdigit() and str(args.nproc_per_node).isdigit():
            world = int(nnodes) * int(args.nproc_per_node)
        print(summary(endings, world, args.log_dir), file=sys.stderr, flush=True)
        return exit_code(endings)
    except Exception as e:  # the launcher itself failed (rendezvous, bad torchrun option): one line too
        logging.getLogger("torch.distributed.run").exception("torchrun failed")
        first = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"cpsim: exit 1 (torchrun failed: {type(e).__name__}: {first}); torchrun's logs: {args.log_dir}",
              file=sys.stderr, flush=True)
        return 1
    return 0


def _message(failure) -> str:
    """The one-line message a rank left in its error file ('' for none)."""
    if not failure.error_file or not os.path.isfile(failure.error_file):
        return ""
    m = failure.message
    text = str(m.get("message", "") if isinstance(m, dict) else m)
    return re.sub(r"^(DistError: )?(\[rank \d+\] )?", "", text)


if __name__ == "__main__":
    sys.exit(main())

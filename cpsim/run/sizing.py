"""``--sizing SPEC``: a host sizing function's answer, with the user's code kept out of this process.

SPEC is a built-in name (``cpsim.sizing.BUILTIN``: ``cpsim``, ``vllm-0.33``, ``vllm-ascend-0.23``),
``path/to/file.py:fn`` or ``package.module:fn``. A built-in is cpsim's own code and is called
here. A user's function is user code (issue 27: it never runs where its output is judged), so
it runs in a short-lived child process (:mod:`cpsim.run.sizing_child`) bounded in time, handed
plain JSON and answering plain JSON; whatever it patches at import dies with the child. What it
answered is read by :func:`cpsim.sizing.read_answer` here.

A SPEC that is malformed or names a missing file or module is bad input (ConfigError, exit 2);
a function that raises, exits, hangs, crashes or answers garbage is a :class:`SizingFailure`
(exit 1, named).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from cpsim import sizing
from cpsim.errors import ConfigError
from cpsim.scenario import Scenario

TIMEOUT_S = 60.0
WHERE = "--sizing"
_BOOT = "import sys; sys.path[0] = sys.argv[1]; from cpsim.run.sizing_child import main; main(*sys.argv[2:])"
_ROOT = str(Path(__file__).resolve().parents[2])


class SizingFailure(Exception):
    """The sizing function under test did not answer usable plain data; the message names it."""


def check_spec(spec: str) -> str:
    """SPEC in the form the child imports (a file made absolute); ConfigError when malformed."""
    if spec in sizing.BUILTIN:
        return spec
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr or not attr.isidentifier():
        raise ConfigError(WHERE, f"{spec!r} is not a built-in ({', '.join(sizing.BUILTIN)}), "
                                 f"path/to/file.py:function nor package.module:function")
    if module_part.endswith(".py") or "/" in module_part or "\\" in module_part:
        file = Path(module_part)
        if not file.is_file():
            raise ConfigError(WHERE, f"sizing file {file} does not exist")
        return f"{file.resolve()}:{attr}"
    if not all(part.isidentifier() for part in module_part.split(".")):
        raise ConfigError(WHERE, f"{module_part!r} is not a module name")
    return spec


def resolve(spec: str, s: Scenario, paths: list[str], timeout: float = TIMEOUT_S) -> tuple[sizing.HostSizing, ...]:
    """The sizing SPEC gives each host the selected ``paths`` run on (one answer per host)."""
    target = check_spec(spec)
    hosts = [h for h in dict.fromkeys(sizing.host_of(p) for p in paths)
             if h in sizing.BUILTIN_HOSTS.get(target, (h,))]
    inputs = [sizing.host_input(s, h) for h in hosts]
    if target in sizing.BUILTIN:
        answers = [sizing.BUILTIN[target](dict(h)) for h in inputs]
    else:
        answers = _ask_child(target, spec, inputs, timeout)
    out = []
    for h, answer in zip(inputs, answers):
        try:
            out.append(sizing.read_answer(answer, h, spec))
        except ValueError as e:
            raise SizingFailure(f"sizing function {spec} (host {h['host']}) {e}") from None
    return tuple(out)


def _ask_child(target: str, spec: str, inputs: list[dict], timeout: float) -> list:
    with tempfile.TemporaryDirectory(prefix="cpsim-sizing-") as tmp:
        src, dst = Path(tmp, "in.json"), Path(tmp, "out.json")
        src.write_text(json.dumps(inputs))
        proc = subprocess.Popen([sys.executable, "-c", _BOOT, _ROOT, target, str(src), str(dst)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, text=True, errors="replace")
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end(proc)
            raise SizingFailure(f"sizing function {spec} ran past {timeout:g} s and was killed") from None
        finally:
            _end(proc)
        tail = " | ".join(output.strip().splitlines()[-3:])
        if not dst.is_file():
            how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited {proc.returncode}"
            raise SizingFailure(f"sizing function {spec} {how} before it answered" + (f": {tail}" if tail else ""))
        try:
            reply = json.loads(dst.read_text())
        except ValueError:
            raise SizingFailure(f"sizing function {spec}: its process wrote an unreadable answer") from None
    if not isinstance(reply, dict):
        raise SizingFailure(f"sizing function {spec}: its process wrote an unreadable answer")
    if "config" in reply:
        raise ConfigError(WHERE, str(reply["config"]))
    if "failed" in reply:
        raise SizingFailure(f"sizing function {spec} {reply['failed']}")
    answers = reply.get("answers")
    if proc.returncode != 0 or not isinstance(answers, list) or len(answers) != len(inputs):
        raise SizingFailure(f"sizing function {spec} exited {proc.returncode} without one answer per host")
    return answers


def _end(proc: subprocess.Popen) -> None:
    """Stop the child and whatever it forked (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()

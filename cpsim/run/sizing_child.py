"""The child side of ``--sizing``: import the user's sizing function once, then answer scenario after scenario.

Started by :mod:`cpsim.run.host_sizer`, which never imports the function itself. Whatever the
function's module does at import (patching cpsim included) happens in this process only.
Requests and answers are JSON lines on two private descriptors (the function's own prints go
to stderr), so nothing but plain data crosses; reading it is the parent's. The first line says
whether the function loaded; then each request line (the host inputs of one scenario) gets one
answer line, until the parent closes the pipe or dies.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path


def _load(target: str):
    module_part, _, attr = target.rpartition(":")
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        sys.path.insert(1, str(Path(module_part).parent))  # its folder, as for a script: its own imports work
        spec = importlib.util.spec_from_file_location("cpsim_sizing_under_test", module_part)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as e:
            if e.name and (module_part + ".").startswith(e.name + "."):
                raise LookupError(f"cannot import {module_part}: no module named {e.name!r}") from None
            raise
    fn = getattr(module, attr, None)
    if fn is None:
        raise LookupError(f"{module_part} has no attribute {attr!r}")
    if not callable(fn):
        raise LookupError(f"{module_part}:{attr} is not a function")
    return fn


def _private_pipes():
    """The parent's two pipes moved off fds 0 and 1, which the function's code then sees as
    /dev/null and stderr: a print cannot corrupt an answer line."""
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    return requests, replies


def _die_with(parent_pid: int) -> None:
    """End this process (and what the function forked: its session's group) once the parent is gone,
    even while the function hangs."""
    import threading
    import time

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                try:
                    os.killpg(0, 9)
                finally:
                    os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True, name="cpsim-sizing-parent-watch").start()


def answer(fn, inputs: list) -> dict:
    """One scenario's reply: the function's answer per host, or what went wrong, as plain data."""
    answers = []
    for host in inputs:
        try:
            answers.append(fn(host))
        except (Exception, SystemExit) as e:  # noqa: BLE001  (its failure, named)
            return {"failed": f"raised {type(e).__name__} for host {host['host']}: {_first(e)}"}
    try:
        json.dumps(answers)
    except (TypeError, ValueError) as e:
        return {"failed": f"answered what is not plain data ({e})"}
    return {"answers": answers}


def main(target: str, parent_pid: str) -> None:
    requests, replies = _private_pipes()
    _die_with(int(parent_pid))
    sys.path.insert(1, os.getcwd())  # package.module SPECs import as from the user's shell

    def send(reply: dict) -> None:
        replies.write(json.dumps(reply) + "\n")
        replies.flush()

    try:
        fn = _load(target)
    except LookupError as e:
        return send({"config": str(e)})
    except (Exception, SystemExit) as e:  # noqa: BLE001  (its import failed: its failure, named)
        return send({"failed": f"raised {type(e).__name__} while its module was imported: {_first(e)}"})
    send({"ready": True})
    for line in requests:
        send(answer(fn, json.loads(line)))


def _first(e: BaseException) -> str:
    text = str(e).splitlines()
    return text[0] if text else repr(e)

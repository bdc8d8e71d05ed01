"""The child side of ``--sizing``: import the user's sizing function, call it once per host, write JSON.

Started by :mod:`cpsim.run.sizing`, which never imports the function itself. Whatever the
function's module does at import (patching cpsim included) happens in this process only.
Its answer goes back as JSON, so nothing but plain data crosses; reading it is the parent's.
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


def _write(dst: str, reply: dict) -> None:
    Path(dst).write_text(json.dumps(reply))


def main(target: str, src: str, dst: str) -> None:
    sys.path.insert(1, os.getcwd())  # package.module SPECs import as from the user's shell
    inputs = json.loads(Path(src).read_text())
    try:
        fn = _load(target)
    except LookupError as e:
        _write(dst, {"config": str(e)})
        return
    except (Exception, SystemExit) as e:  # noqa: BLE001  (its import failed: its failure, named)
        _write(dst, {"failed": f"raised {type(e).__name__} while its module was imported: {_first(e)}"})
        return
    answers = []
    for host in inputs:
        try:
            answers.append(fn(host))
        except (Exception, SystemExit) as e:  # noqa: BLE001
            _write(dst, {"failed": f"raised {type(e).__name__} for host {host['host']}: {_first(e)}"})
            return
    try:
        text = json.dumps({"answers": answers})
    except (TypeError, ValueError) as e:
        _write(dst, {"failed": f"answered what is not plain data ({e})"})
        return
    Path(dst).write_text(text)


def _first(e: BaseException) -> str:
    text = str(e).splitlines()
    return text[0] if text else repr(e)

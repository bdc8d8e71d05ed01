"""Which upstream release a kernel file belongs to, and whose contract judges it.

A kernel given by path (``--kernel-v2 .../vllm/v1/worker/gpu/block_table.py:NAME``) from an unpacked
release — a ``pip install --target`` folder or site-packages (``vllm-X.dist-info`` beside the package),
or a folder named for the release (``vllm-X``, an sdist's ``vllm_ascend-X``) — is that release's. A
release cpsim's table lists needs no word; another is judged with the nearest listed release's
contract (its ABI and profile), and the run says whether the contract files found there are the same
(:func:`cpsim.releases.standing`). Only files are read here: the kernel's code runs in its worker.
"""

from __future__ import annotations

import re
from pathlib import Path

from cpsim import releases


def release_folder(file: Path) -> tuple[str, str, Path] | None:
    """(project, version, release root) of the unpacked release whose package holds ``file``, or None
    (a vllm-ascend file beside an installed vLLM is vllm-ascend's)."""
    file = Path(file).resolve()
    for name in releases.PROJECTS:
        package = releases.project(name).package
        for top in file.parents:
            if top / package not in file.parents:
                continue
            for info in sorted(top.glob(f"{package}-*.dist-info")):
                return name, info.name[len(package) + 1: -len(".dist-info")], top
            m = re.fullmatch(rf"({re.escape(name)}|{re.escape(package)})-(\d[\w.]*)", top.name)
            if m:
                return name, m.group(2), top
    return None


def kernel_standing(spec: str, path: str) -> releases.Standing | None:
    """The standing of the release a ``FILE.py:NAME`` kernel comes from (None: not from an unpacked
    release, or from one the table lists)."""
    file = spec.rpartition(":")[0] if ":" in spec else spec
    if not file.endswith(".py") or not Path(file).is_file():
        return None
    found = release_folder(Path(file))
    if found is None:
        return None
    name, version, root = found
    if releases.release(name, version) is not None:
        return None
    family = "v2" if path.startswith("v2") else "v1"
    return releases.standing(name, version, root, paths=(family,), only_present=True)

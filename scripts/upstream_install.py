"""Create (once) the side environment the upstream check drives released runtimes in.

``python scripts/upstream_install.py VENVS vllm==0.33.0 vllm==0.23.0 ...``:

- ``VENVS/base``: one python3.11 venv of what every release shares: cpsim's torch and triton
  (never a release's), numpy, and the small pure-Python packages the releases' host block-table
  modules import (``NEEDS``), pinned by the newest release's own metadata where it names a range.
- ``VENVS/vllm-X``: release X installed with ``--no-deps --target`` (a folder, not a venv); a job
  selects it by putting the folder first on the driver child's ``sys.path``. A NEEDS package whose
  base version release X's metadata does not accept (vLLM 0.13-0.23 want transformers < 5, the
  base has 5.x) is installed into that folder too, at X's range, and so are those of its own
  requirements the base does not satisfy; the folder shadows the base for that release only.

The probe imports only the host modules the release table lists for the release (cpsim/releases/PROJECT.json;
for a release it does not list, the nearest listed release's modules that the folder has). A third-party
module still missing on import is installed into the release's folder and named in the output (add it to
``NEEDS``); a module of the release itself that is missing, one that its install did not bring, or any other
import error is one line, ``RELEASE: broken: WHY``, and exit 1 (the other releases are still set up). Each part is stamped; a stamped part is left alone. The timings printed are
per part (pip's cache may be warm: a second fresh run downloads nothing).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cpsim import releases  # noqa: E402

BASE = ["torch==2.13.0", "triton==3.6.0", "numpy>=1.24,<2.3"]
# Found by trial on vLLM 0.33.0 (import vllm.v1.worker.block_table, vllm.v1.worker.gpu.block_table).
NEEDS = ["packaging", "psutil", "pyzmq", "urllib3", "regex", "pydantic", "cbor2", "transformers", "aiohttp",
         "requests", "openai-harmony", "openai", "pillow", "pybase64", "cachetools", "msgspec", "cloudpickle",
         "uvloop", "py-cpuinfo", "prometheus_client", "xgrammar", "fastapi", "partial_json_parser", "llguidance",
         "gguf"]  # gguf: vLLM 0.13-0.23 import it there too
NEVER_BESIDE = {"torch", "triton", "numpy"}  # cpsim's own, one version for every release
MODULE_TO_DIST = {"yaml": "pyyaml", "zmq": "pyzmq", "google": "protobuf", "PIL": "pillow",
                  "cpuinfo": "py-cpuinfo", "cv2": "opencv-python-headless"}
# The modules the probe imports are the release's host modules in cpsim/releases/PROJECT.json (probe_modules).
ENV = {"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}
BASE_STAMP = ".cpsim-upstream-base"
STAMP = ".cpsim-upstream"

# Run by the base python with the release folder first on sys.path: which of the requirement strings
# on stdin (one per line, markers allowed) the environment does not satisfy, as "name spec" lines.
UNMET = r"""
import importlib.metadata as md, sys
from packaging.requirements import Requirement
for line in sys.stdin.read().splitlines():
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        have = None
    if have is None or (req.specifier and not req.specifier.contains(have, prereleases=True)):
        print(req.name, str(req.specifier))
"""
REQUIRES = ("import importlib.metadata as m, sys, json; "
            "print(json.dumps({d: m.requires(d) or [] for d in sys.argv[1:]}))")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def env_with(folder: Path | None) -> dict:
    env = dict(os.environ, **ENV)
    env.pop("PYTHONPATH", None)
    if folder is not None:
        env["PYTHONPATH"] = str(folder)
    return env


def requires(py: str, folder: Path | None, dists: list[str]) -> dict[str, list[str]]:
    out = subprocess.run([py, "-c", REQUIRES, *dists], capture_output=True, text=True, cwd="/",
                         env=env_with(folder), check=True).stdout
    return json.loads(out)


def pins(py: str, folder: Path | None, dist: str) -> dict[str, str]:
    """The release's requirement ranges (no extras, no markers) by normalised name."""
    found = {}
    for line in requires(py, folder, [dist])[dist]:
        if "extra ==" in line:
            continue
        m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*([^;]*)", line)
        if m:
            found[norm(m.group(1))] = m.group(3).replace(" ", "")
    return found


def unmet(py: str, folder: Path, reqs: list[str]) -> list[str]:
    """Requirement strings ("name spec") the base plus ``folder`` does not satisfy."""
    reqs = [r for r in reqs if "extra ==" not in r]
    if not reqs:
        return []
    out = subprocess.run([py, "-c", UNMET], input="\n".join(reqs), capture_output=True, text=True, cwd="/",
                         env=env_with(folder), check=True).stdout.split("\n")
    return [line.split(" ", 1)[0] + line.split(" ", 1)[1] for line in out if line.strip()]


def pip(py: str, *args: str) -> None:
    subprocess.run([py, "-m", "pip", "install", "-q", *args], check=True)


class InstallError(Exception):
    """A release that cannot be set up: one line, the release's row is broken (never a traceback)."""


def probe_modules(family: str, version: str, folder: Path) -> list[str]:
    """The host modules release ``version`` has: the table's for a listed release; for another, those of
    the nearest listed release whose files are in ``folder`` (a path it no longer has is not probed)."""
    rel = releases.release(family, version)
    if rel is not None:
        return rel.host_modules()
    return [m for m in releases.nearest(family, version).host_modules()
            if (folder / (m.replace(".", "/") + ".py")).is_file()]


def missing_module(py: str, folder: Path, family: str, version: str) -> str | None:
    """The third-party module the release's host modules still lack (None: they import). A module of the
    release itself that is missing, or any other import error, is an InstallError."""
    mods = probe_modules(family, version, folder)
    if not mods:
        raise InstallError(f"{family}=={version}: none of the host modules cpsim drives is in {folder}")
    r = subprocess.run([py, "-c", "import " + ", ".join(mods)], capture_output=True, text=True, cwd="/",
                       env=env_with(folder))
    if not r.returncode:
        return None
    m = re.search(r"No module named '([^']+)'", r.stderr)
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
    if not m:
        raise InstallError(f"{family}=={version} in {folder} does not import: {last}")
    top = m.group(1).split(".")[0]
    if norm(top) == norm(releases.project(family).package) or top == releases.project(family).package:
        raise InstallError(f"{family}=={version} has no module {m.group(1)} (the table lists "
                           f"{', '.join(mods)} for it): {last}")
    return top


def install_base(base: Path, newest: str, folder_of_newest: Path) -> float:
    """The shared venv; NEEDS pinned by the newest release (read from its folder, installed first)."""
    if (base / BASE_STAMP).exists():
        return 0.0
    t0 = time.time()
    py = str(base / "bin" / "python")
    if not Path(py).exists():
        subprocess.run(["python3.11", "-m", "venv", str(base)], check=True)
    pip(py, *BASE)
    wanted = pins(py, folder_of_newest, newest.split("==")[0])
    pip(py, *[n + wanted.get(norm(n), "") for n in NEEDS])
    (base / BASE_STAMP).write_text(f"pinned by {newest}\n")
    return time.time() - t0


def put_beside(py: str, folder: Path, reqs: list[str], release: str) -> list[str]:
    """Install into ``folder`` each requirement the base does not satisfy, then theirs, until none is left."""
    placed: list[str] = []
    for _ in range(12):
        todo = [r for r in unmet(py, folder, reqs) if norm(re.split(r"[<>=!~ ]", r)[0]) not in NEVER_BESIDE]
        if not todo:
            return placed
        pip(py, "--no-deps", "--upgrade", "--target", str(folder), *todo)
        placed += todo
        names = [re.split(r"[<>=!~ ]", r)[0] for r in todo]
        reqs = [x for got in requires(py, folder, names).values() for x in got]
    raise SystemExit(f"{release}: requirements still unmet in {folder} after 12 rounds")


def unpack(py: str, folder: Path, release: str) -> None:
    """The release's wheel into ``folder`` (no dependencies), unless it is there already."""
    if not list(folder.glob("*.dist-info")):
        try:
            pip(py, "--no-deps", "--upgrade", "--target", str(folder), release)
        except subprocess.CalledProcessError as e:
            raise InstallError(f"{release}: pip could not install it (exit {e.returncode})") from None


def install_release(base: Path, folder: Path, release: str) -> tuple[float, list[str]]:
    """``release`` into ``folder`` (no deps); what the base lacks for it beside it. (seconds, placed)."""
    if (folder / STAMP).exists():
        return 0.0, []
    t0 = time.time()
    py = str(base / "bin" / "python")
    family = release.split("==")[0]
    unpack(py, folder, release)
    wanted = pins(py, folder, family)
    placed = put_beside(py, folder, [n + wanted.get(norm(n), "") for n in NEEDS], release)
    tried: set[str] = set()
    while (mod := missing_module(py, folder, family, release.split("==")[1])) is not None:
        dist = MODULE_TO_DIST.get(mod, mod)
        if dist in tried:  # installing it did not make it importable: no second try
            raise InstallError(f"{release}: its import needs module {mod}, still missing after installing {dist}")
        tried.add(dist)
        print(f"{release}: its import also needs {dist} (add it to NEEDS)", flush=True)
        placed += put_beside(py, folder, [dist + wanted.get(norm(dist), "")], release)
    (folder / STAMP).write_text(json.dumps({"release": release, "beside": placed}) + "\n")
    return time.time() - t0, placed


def version_key(release: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", release.split("==")[1])[:3])


def install_all(venvs: Path, wanted: list[str]) -> list[str]:
    """Base first (its pins read from the newest release, which is therefore unpacked first), then each
    release's folder. One line per part: what was installed and how long it took."""
    base = venvs / "base"
    newest = max(wanted, key=version_key)
    lines = []
    first_folder = venvs / newest.replace("==", "-")
    t0, unpacked = time.time(), 0.0
    if not (base / BASE_STAMP).exists():
        unpack(sys.executable, first_folder, newest)  # its pins are read before the base exists
        unpacked = time.time() - t0
    took = install_base(base, newest, first_folder)
    lines.append(f"base venv: {'ready' if not took else f'installed in {took:.0f} s (pinned by {newest})'}")
    for release in sorted(wanted, key=version_key, reverse=True):
        folder = venvs / release.replace("==", "-")
        try:
            seconds, placed = install_release(base, folder, release)
        except InstallError as e:
            lines.append(f"{release}: broken: {e}")
            print(lines[-1], flush=True)
            continue
        if release == newest:
            seconds += unpacked
        beside = f"; beside it: {', '.join(placed)}" if placed else ""
        lines.append(f"{release}: {'ready' if not seconds else f'installed in {seconds:.0f} s'} at {folder}{beside}")
    return lines


def main(argv: list[str]) -> int:
    """Exit 1 when any release could not be set up (its line says why; the others are set up)."""
    try:
        lines = install_all(Path(argv[0]).resolve(), argv[1:])
    except InstallError as e:  # the newest release, whose metadata pins the base
        print(f"broken: {e}", flush=True)
        return 1
    for line in lines:
        print(line, flush=True)
    return 1 if any(": broken: " in line for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Create (once) a side venv for one runtime release and install it without dependencies.

``python scripts/upstream_install.py VENV vllm==0.33.0``: python3.11 venv; cpsim's torch and
triton (never the release's); the release with ``--no-deps``; then the small pure-Python
packages its host block-table modules import. Those are a known list (``NEEDS``); each is
pinned by the release's own metadata where it names one (transformers, fastapi, ...).
A module still missing on import is installed by its distribution name and named in the
output (add it to ``NEEDS``). The venv is stamped; a stamped venv is left alone.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

BASE = ["torch==2.13.0", "triton==3.6.0", "numpy>=1.24,<2.3"]
# Found by trial on vLLM 0.33.0 (import vllm.v1.worker.block_table, vllm.v1.worker.gpu.block_table).
NEEDS = ["packaging", "psutil", "pyzmq", "urllib3", "regex", "pydantic", "cbor2", "transformers", "aiohttp",
         "requests", "openai-harmony", "openai", "pillow", "pybase64", "cachetools", "msgspec", "cloudpickle",
         "uvloop", "py-cpuinfo", "prometheus_client", "xgrammar", "fastapi", "partial_json_parser", "llguidance"]
MODULE_TO_DIST = {"yaml": "pyyaml", "zmq": "pyzmq", "google": "protobuf", "PIL": "pillow",
                  "cpuinfo": "py-cpuinfo", "cv2": "opencv-python-headless"}
IMPORTS = {"vllm": "import vllm.v1.worker.block_table, vllm.v1.worker.gpu.block_table"}
ENV = {"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(py: str, dist: str) -> dict[str, str]:
    """Requirement strings of the installed release's METADATA (no extras, no markers), by name."""
    code = ("import importlib.metadata as m, sys; print('\\n'.join(m.requires(sys.argv[1]) or []))")
    out = subprocess.run([py, "-c", code, dist], capture_output=True, text=True).stdout.splitlines()
    found = {}
    for line in out:
        if "extra ==" in line:
            continue
        req = line.split(";")[0].strip()
        m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)", req)
        if m:
            found[norm(m.group(1))] = m.group(3).replace(" ", "")
    return found


def pip(py: str, *args: str) -> None:
    subprocess.run([py, "-m", "pip", "install", "-q", *args], check=True)


def missing_module(py: str, family: str) -> str | None:
    import os
    r = subprocess.run([py, "-c", IMPORTS[family]], capture_output=True, text=True, cwd="/",
                       env=dict(os.environ, **ENV))
    m = re.search(r"No module named '([^'.]+)", r.stderr)
    if r.returncode and not m:
        raise SystemExit(f"{family} does not import: {r.stderr.strip().splitlines()[-1]}")
    return m.group(1) if m else None


def install(venv: Path, release: str) -> float:
    stamp = venv / ".cpsim-upstream"
    if stamp.exists():
        return 0.0
    t0 = time.time()
    family = release.split("==")[0]
    py = str(venv / "bin" / "python")
    if not Path(py).exists():
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
    pip(py, *BASE)
    pip(py, "--no-deps", release)
    wanted = pins(py, family)
    pip(py, *[n + wanted.get(norm(n), "") for n in NEEDS])
    for _ in range(40):
        mod = missing_module(py, family)
        if mod is None:
            break
        dist = MODULE_TO_DIST.get(mod, mod)
        print(f"{release}: its import also needs {dist} (add it to NEEDS)", flush=True)
        pip(py, dist + wanted.get(norm(dist), ""))
    else:
        raise SystemExit(f"{release}: still missing modules after 40 installs")
    stamp.write_text(release + "\n")
    return time.time() - t0


if __name__ == "__main__":
    took = install(Path(sys.argv[1]), sys.argv[2])
    print(f"{sys.argv[2]}: {'ready' if not took else f'installed in {took:.0f} s'} at {sys.argv[1]}")

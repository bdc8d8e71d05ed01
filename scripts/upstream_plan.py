"""What ``make upstream-check`` runs, read from the release table (cpsim/releases/PROJECT.json ``matrix``), and
how it treats a release the table does not list.

- The default set: the table's ``matrix`` of each project (vLLM host classes, kernels-only releases,
  vllm-ascend kernels and host classes beside the vLLM each was ``built_for``, the torchrun rows).
- A release the table does not list (``--vllm X``, ``--latest``) is driven and its kernels run with the
  nearest listed release's contract; a ``contract`` row says "same files" or "unread changes in FILE"
  (exit ``releases.UNREAD_CHANGES_EXIT`` when nothing else fails).
- A path the release does not have is a "not in this release" row (n/a), never a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from cpsim import releases

NOT_IN_RELEASE = "not in this release"
SAME_FILES, UNREAD = "same files", "unread changes"


def matrix(project: str, part: str) -> tuple[str, ...]:
    return tuple(releases.project(project).matrix.get(part, ()))


def host_paths(project: str, version: str) -> tuple[str, ...]:
    """The paths whose host classes release ``version`` ships (the nearest listed release's if unlisted)."""
    rel = releases.release(project, version) or releases.nearest(project, version, need_rules=True)
    return tuple(p for p in releases.PATHS if rel.path(p).host and not rel.path(p).absent)


def ascend_hosts() -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """(vllm-ascend release, the vLLM release it was built for, its host paths), from the table."""
    return tuple((v, releases.release("vllm-ascend", v).built_for, host_paths("vllm-ascend", v))
                 for v in matrix("vllm-ascend", "host"))


def torchrun_hosts() -> tuple[tuple[str, str, str, str | None], ...]:
    """(row label, family, the vLLM folder's version, the vllm-ascend sdist's version or None)."""
    out = [(f"vllm {v}", "vllm", v, None) for v in matrix("vllm", "torchrun")]
    out += [(f"vllm-ascend {v}", "vllm-ascend", releases.release("vllm-ascend", v).built_for, v)
            for v in matrix("vllm-ascend", "torchrun")]
    return tuple(out)


def kernel_plan(project: str, version: str) -> dict[str, tuple[str | None, str]]:
    """path -> (the released kernel ``FILE:NAME`` inside the release, or None; why the path is not in the
    release, "" when it is). An unlisted release: the nearest listed one's."""
    rel = releases.release(project, version) or releases.nearest(project, version)
    return {p: (rel.path(p).kernel, rel.path(p).absent) for p in releases.PATHS
            if rel.path(p).kernel or rel.path(p).absent}


def standing(project: str, version: str, root: Path | None, hosts: bool):
    """None for a listed release; else its :class:`cpsim.releases.Standing` (files compared under ``root``)."""
    if releases.release(project, version) is not None:
        return None
    return releases.standing(project, version, root, need_rules=hosts, only_present=not hosts)


def contract_row(row, label: str, st) -> dict:
    """The row that says how an unlisted release was judged (``row`` is upstream_check.row)."""
    return row(label, "contract", "*", "*", UNREAD if st.unread else SAME_FILES, detail=st.line())


def kernel_files(project: str, version: str) -> tuple[str, ...]:
    """The files of the release's kernels (and the contract files) to take out of its wheel."""
    files = {spec.split(":")[0] for spec, _ in kernel_plan(project, version).values() if spec}
    files |= {k.split("#")[0] for p in releases.PATHS for k in releases.project(project).path_files.get(p, [])}
    return tuple(sorted(files))


def extract_wheel(version: str, src: Path, top: Path, timeout: float) -> Path:
    """vLLM ``version``'s kernel and contract files from its wheel into ``top`` (downloaded once, never
    installed; the wheel is deleted whatever happens)."""
    if (top / ".cpsim-extracted").exists():
        return top
    src.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                    "-d", str(src), f"vllm=={version}"], check=True, timeout=timeout)
    wheels = list(src.glob(f"vllm-{version}-*.whl"))
    try:
        if len(wheels) != 1:
            raise ValueError(f"expected one vllm-{version} wheel in {src}, found {len(wheels)}")
        take_files(wheels[0], top, kernel_files("vllm", version))
    finally:
        for w in wheels:
            w.unlink(missing_ok=True)
    return top


def take_files(wheel: Path, top: Path, wanted) -> list[str]:
    """The files of ``wanted`` the wheel has, extracted under ``top`` (stamped): a file it lacks is simply
    not there, and the row of that path says so (not in this release, or broken), one line each."""
    with zipfile.ZipFile(wheel) as z:
        have = [f for f in wanted if f in set(z.namelist())]
        for f in have:
            z.extract(f, top)
    (top / ".cpsim-extracted").write_text("".join(f + "\n" for f in have))
    return have


def latest(project: str, pip_python: str = sys.executable) -> str | None:
    """The newest release of ``project`` on the registry (``pip index versions``), or None."""
    p = subprocess.run([pip_python, "-m", "pip", "index", "versions", project], capture_output=True, text=True,
                       timeout=300)
    m = re.search(rf"^{re.escape(project)} \(([^)]+)\)", p.stdout, re.M)
    return m.group(1) if m else None


def full_default(args) -> bool:
    """Whether a run covers the whole default set (then, and only then, it rewrites the matrix in the doc)."""
    return (not args.only and not args.latest
            and args.vllm == ",".join(matrix("vllm", "host"))
            and args.vllm_kernels == ",".join(matrix("vllm", "kernels_only"))
            and args.ascend == ",".join(default_ascend()))


def default_ascend() -> list[str]:
    return sorted({*matrix("vllm-ascend", "kernels"), *matrix("vllm-ascend", "host")}, key=releases.version_key)


def ascend_source(version: str, venvs: Path, timeout: float) -> Path:
    """The unpacked vllm-ascend sdist (downloaded once, never installed). pip prepares an sdist's
    metadata before it keeps the file: without build isolation, in a small venv of setuptools, and
    with the release's setup.py told not to compile its NPU kernels (SOC_VERSION, COMPILE_CUSTOM_KERNELS)."""
    src = venvs / "src"
    top = src / f"vllm_ascend-{version}"
    if top.exists():
        return top
    dl = venvs / "sdist-download"
    if not (dl / "bin" / "python").exists():
        subprocess.run(["python3.11", "-m", "venv", str(dl)], check=True)
        subprocess.run([str(dl / "bin" / "python"), "-m", "pip", "install", "-q", "setuptools", "setuptools_scm",
                        "wheel", "packaging"], check=True)
    env = dict(os.environ, SOC_VERSION="ascend910b1", COMPILE_CUSTOM_KERNELS="0")
    subprocess.run([str(dl / "bin" / "python"), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    "--no-build-isolation", "-d", str(src), f"vllm-ascend=={version}"], check=True, env=env,
                   timeout=timeout)
    with tarfile.open(src / f"vllm_ascend-{version}.tar.gz") as tar:
        tar.extractall(src, filter="data")
    return top


def add_latest(args) -> None:
    """--latest: the newest vLLM joins --vllm (installed, host classes and kernels), the newest vllm-ascend
    the vllm-ascend kernels (its host classes need the vLLM it was built for: not driven here)."""
    for project in ("vllm", "vllm-ascend"):
        newest = latest(project)
        print(f"--latest: newest {project} on the registry: {newest or 'not found'}", flush=True)
        if newest is None:
            continue
        if project == "vllm" and newest not in args.vllm.split(","):
            args.vllm = ",".join(filter(None, [args.vllm, newest]))
        if project == "vllm-ascend" and newest not in args.ascend.split(","):
            args.ascend = ",".join(filter(None, [args.ascend, newest]))
            args.ascend_unlisted.append(newest)

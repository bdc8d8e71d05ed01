"""The releases cpsim read, as data: one JSON file per upstream project (``vllm.json``, ``vllm-ascend.json``).

Each read release names, per path (``v1``, ``v2``): its released kernel and that kernel's ABI, the
profile it is judged by, its host class (``module:Class``) — or why the path is not in that release;
the rules its host adapter follows (``cpsim.stack``), the vLLM release it was built for
(vllm-ascend), and the content hashes of the files its contract was read from
(:mod:`cpsim.releases.contract`). ``matrix`` lists what ``make upstream-check`` runs.

Every list of releases in cpsim reads this table: the ABI and profile tables, the stack adapters,
the install probe and the upstream check. A release the table does not list is judged with the
contract of the nearest listed one (:func:`standing`), and says whether its contract files are
the same. Pure standard library, no cpsim imports: the lowest layer, and the stack driver's child
(the side venv's python) reads it too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cpsim.releases.contract import ABSENT, hashes

HERE = Path(__file__).resolve().parent
PROJECTS = {"vllm": "vllm.json", "vllm-ascend": "vllm-ascend.json"}
PATHS = ("v1", "v2")
# Exit status of a run judged with the nearest listed release's contract whose contract files
# changed (docs/RUNNING.md): past 0/1/2/3, and only when every invariant holds.
UNREAD_CHANGES_EXIT = 4


class TableError(ValueError):
    """The data file breaks a rule of its own (a test feeds the loader a broken table)."""


@dataclass(frozen=True)
class PathContract:
    """One path of one release."""

    abi: str | None = None          # the released kernel's ABI (cpsim.kernels.under_test.ABIS)
    kernel: str | None = None       # FILE:NAME of the released kernel inside the wheel / sdist
    profile: str | None = None      # the profile its kernel is judged by (cpsim.check.profiles)
    host: str | None = None         # MODULE:Class of the host block table
    host_profile: str | None = None  # where the host classes are judged by another profile than the kernel
    absent: str = ""                # why the path is not in this release ("" when it is)

    @property
    def host_module(self) -> str | None:
        return self.host.split(":")[0] if self.host else None


@dataclass(frozen=True)
class Release:
    project: str
    version: str
    paths: dict                     # path -> PathContract
    rules: dict                     # the stack adapter's rules ({} : its host classes were not read)
    files: dict                     # contract file -> sha256 ({}: not recorded)
    built_for: str | None = None    # vllm-ascend: the vLLM release it was built for
    width: str | None = None        # MODULE:function of get_block_table_width (vLLM)

    def path(self, path: str) -> PathContract:
        return self.paths.get(path, PathContract(absent=f"no {path} path recorded"))

    def host_modules(self) -> list[str]:
        """The modules the install probe imports: the host classes' modules the release has."""
        mods = [p.host_module for p in self.paths.values() if p.host_module and not p.absent]
        if self.width:
            mods.append(self.width.split(":")[0])
        return list(dict.fromkeys(mods))


@dataclass(frozen=True)
class Project:
    name: str
    label: str                      # how reports name it ("vLLM")
    package: str                    # the import name ("vllm", "vllm_ascend")
    launch_calls: tuple
    path_files: dict                # path -> the contract files that path is judged by
    releases: dict                  # version -> Release
    matrix: dict                    # what make upstream-check runs
    abi_kernels: dict               # ABI -> the released kernel's name, for the ABI table's line

    def listed(self) -> list[str]:
        return sorted(self.releases, key=version_key)


def version_key(version: str) -> tuple:
    """Orders "0.23.0" < "0.23.0.post1" < "0.24.0"; a bare "0.34" is "0.34.0"."""
    nums = [int(x) for x in re.findall(r"\d+", version)]
    return tuple(nums[:3] + [0] * (3 - len(nums[:3])) + nums[3:4])


@lru_cache(maxsize=None)
def project(name: str) -> Project:
    if name not in PROJECTS:
        raise TableError(f"no release table for {name!r} (have {', '.join(PROJECTS)})")
    return parse(json.loads((HERE / PROJECTS[name]).read_text()))


def parse(data: dict) -> Project:
    """A project's table from its JSON; TableError naming the first broken rule."""
    name = data["project"]
    releases = {}
    for version, r in data["releases"].items():
        paths = {p: PathContract(**c) for p, c in r.get("paths", {}).items()}
        for p, c in paths.items():
            if p not in PATHS:
                raise TableError(f"{name} {version}: unknown path {p!r}")
            if c.absent and (c.abi or c.host or c.kernel):
                raise TableError(f"{name} {version} {p}: a path not in the release names no kernel or host")
        releases[version] = Release(name, version, paths, r.get("rules", {}), r.get("files", {}),
                                    r.get("built_for"), r.get("width"))
    proj = Project(name, data["label"], data["package"], tuple(data["launch_calls"]), data["path_files"],
                   releases, data.get("matrix", {}), data.get("abi_kernels", {}))
    _check_abi_profiles(proj)
    return proj


def _check_abi_profiles(proj: Project) -> None:
    """Every release of one ABI is judged by one profile (the ABI's profile is the table's)."""
    seen: dict[str, tuple[str, str]] = {}
    for r in proj.releases.values():
        for c in r.paths.values():
            if c.abi and c.profile:
                first = seen.setdefault(c.abi, (c.profile, r.version))
                if first[0] != c.profile:
                    raise TableError(f"{proj.name}: ABI {c.abi} is judged by {first[0]} in {first[1]} and by "
                                     f"{c.profile} in {r.version}")


def release(name: str, version: str) -> Release | None:
    return project(name).releases.get(version)


def abi_profiles() -> dict[str, str]:
    """ABI -> the profile its releases are judged by (every project)."""
    out = {}
    for name in PROJECTS:
        for r in project(name).releases.values():
            out.update({c.abi: c.profile for c in r.paths.values() if c.abi and c.profile})
    return out


def span(versions: list[str], listed: list[str]) -> str:
    """``versions`` as runs of consecutive ``listed`` releases: "0.19.0-0.25.0", "0.28.0, 0.31.0"."""
    at = sorted(listed.index(v) for v in versions)
    runs: list[list[int]] = []
    for i in at:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(listed[r[0]] if len(r) == 1 else f"{listed[r[0]]}-{listed[r[-1]]}" for r in runs)


def abi_releases(abi: str) -> str:
    """The releases whose kernel takes ``abi``, as a line ("vLLM 0.32.0-0.34.0 (ComputeSlotMappingKernel)")."""
    for name in PROJECTS:
        proj = project(name)
        found = [r.version for r in proj.releases.values() for c in r.paths.values() if c.abi == abi]
        if found:
            kernel = proj.abi_kernels.get(abi)
            return f"{proj.label} {span(found, proj.listed())}" + (f" ({kernel})" if kernel else "")
    return ""


def profile_releases(profile: str) -> str:
    """The releases judged by ``profile`` (by their kernels or host classes), as a line
    ("vLLM 0.26.0-0.31.0 v1, 0.31.0 MRV2")."""
    parts = []
    for name in PROJECTS:
        proj = project(name)
        per_path = {p: [r.version for r in proj.releases.values()
                        if profile in (r.path(p).profile, r.path(p).host_profile)] for p in PATHS}
        per_path = {p: v for p, v in per_path.items() if v}
        if not per_path:
            continue
        spans = {p: span(v, proj.listed()) for p, v in per_path.items()}
        if len(set(spans.values())) == 1 and len(spans) == len(PATHS):
            parts.append(f"{proj.label} {spans['v1']}")
        else:
            parts.append(f"{proj.label} " + ", ".join(f"{s} {'MRV2' if p == 'v2' else p}" for p, s in spans.items()))
    return "; ".join(parts)


# ---- a release the table may not list ----------------------------------------------------------------

@dataclass(frozen=True)
class Standing:
    """How a release is judged: by its own contract (listed), or by the nearest listed release's, whose
    contract files are the same (``changed`` empty) or not (the files named)."""

    project: str
    version: str
    contract: str                   # the listed release whose contract is used
    listed: bool
    changed: tuple = ()             # contract files whose content differs from the contract release's
    absent_paths: tuple = ()        # paths the release does not have (not in this release)
    unchecked: tuple = ()           # contract files not in the folder given, so not compared (only_present)

    @property
    def unread(self) -> bool:
        return bool(self.changed)

    def line(self) -> str:
        label = project(self.project).label
        if self.listed:
            return f"{label} {self.version}: a release cpsim read"
        if not self.changed:
            return f"{label} {self.version}: judged with {self.contract}'s contract (same files)" + self._unchecked()
        return (f"{label} {self.version}: judged with {self.contract}'s contract; unread changes in "
                f"{', '.join(shown(k) for k in self.changed)}") + self._unchecked()

    def _unchecked(self) -> str:
        return f" ({', '.join(shown(k) for k in self.unchecked)} not there, not compared)" if self.unchecked else ""

    def to_dict(self) -> dict:
        return {"project": self.project, "version": self.version, "contract": self.contract, "listed": self.listed,
                "same_files": not self.changed, "unread_changes": list(self.changed),
                "absent_paths": list(self.absent_paths), "not_compared": list(self.unchecked)}


def shown(key: str) -> str:
    """A contract file as a report names it: ``X#launch`` is "X (launch lines)", ``X#def:a,b`` is
    "X (definitions of a, b)"."""
    path, _, part = key.partition("#")
    if part.startswith("def:"):
        return f"{path} (definitions of {part[4:].replace(',', ', ')})"
    return f"{path} (launch lines)" if part == "launch" else key


def nearest(name: str, version: str, need_rules: bool = False) -> Release:
    """The listed release whose contract an unlisted ``version`` is judged with: the newest listed one not
    after it, else the oldest; ``need_rules``: among those whose host classes were read."""
    proj = project(name)
    pool = [r for r in proj.releases.values() if r.files and (r.rules or not need_rules)]
    if not pool:
        raise TableError(f"{name}: no release with recorded contract files")
    pool.sort(key=lambda r: version_key(r.version))
    before = [r for r in pool if version_key(r.version) <= version_key(version)]
    return before[-1] if before else pool[0]


def standing(name: str, version: str, root: Path | None, need_rules: bool = False,
             paths: tuple = PATHS, only_present: bool = False) -> Standing:
    """``version`` (unpacked at ``root``) judged: listed, or by :func:`nearest` after comparing the contract
    files of ``paths`` (``root`` None: nothing to compare, counted as changed). ``only_present``: a contract
    file missing under ``root`` is not compared (a kernel file taken out of its wheel alone), not changed."""
    listed = release(name, version)
    if listed is not None and (listed.rules or not need_rules):
        absent = tuple(p for p in paths if listed.path(p).absent)
        return Standing(name, version, version, True, absent_paths=absent)
    base = nearest(name, version, need_rules)
    proj = project(name)
    keys = [k for p in paths for k in proj.path_files.get(p, [])]
    keys = [k for k in dict.fromkeys(keys) if k in base.files]
    got = hashes(root, keys, proj.launch_calls) if root is not None else {k: "" for k in keys}
    unchecked = tuple(k for k in keys if only_present and got[k] == ABSENT and base.files[k] != ABSENT)
    changed = tuple(k for k in keys if got[k] != base.files[k] and k not in unchecked)
    # a path is gone when its own modules are; the spec definitions both paths read do not say
    absent = tuple(p for p in paths if base.path(p).absent
                   or all(got.get(k) == ABSENT for k in proj.path_files.get(p, []) if k in got and "#def:" not in k))
    return Standing(name, version, base.version, False, changed, absent, unchecked)

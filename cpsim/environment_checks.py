"""What ``cpsim doctor`` checks: the environment a new server gives cpsim.

Each check is a plain function returning ``Row``s, so tests can feed them a fake
environment. Nothing here imports torch_npu or triton at module load: torch_npu is
imported only to count NPUs (as ``cpsim run`` would), and triton only through the
kernel checks, which go through the public flow (scenario -> ``run_virtual`` ->
coordinator) so they keep working whatever the kernels look like inside.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from cpsim.errors import ConfigError
from cpsim import scenario as sc

STATUSES = ("ok", "info", "warn", "fail")
ENV_VARS = ("ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT",
            "TRITON_INTERPRET")
MIN_PYTHON = (3, 10)
# The triton-ascend release the docs and the `npu` extra pin (PyPI's only release when written).
TRITON_ASCEND_PIN = "triton-ascend==3.2.0"


@dataclass
class Row:
    check: str
    status: str                 # ok | info | warn | fail ("fail" makes doctor exit 1)
    detail: str
    fix: str = ""
    seconds: float | None = None  # how long the check took (kernel launches); not part of the verdict

    def key(self) -> tuple:
        """What must agree for two ranks' rows to print as one."""
        return (self.check, self.status, self.detail, self.fix)


def failed(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.status == "fail"]


# ---- installed distributions ---------------------------------------------------

def dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, int, int] | None:
    """major.minor.patch of a version string: 2.7.1 from 2.7.1.post2, 2.7.1+cpu or 2.7.1rc1."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


def _fmt(rel: tuple[int, int, int] | None) -> str:
    return ".".join(map(str, rel)) if rel else "?"


def python_row() -> Row:
    v = sys.version_info
    text = f"{platform.python_version()} ({sys.executable})"
    if (v.major, v.minor) < MIN_PYTHON:
        return Row("python", "fail", text, "cpsim needs Python >= %d.%d" % MIN_PYTHON)
    return Row("python", "ok", text)


def torch_rows() -> list[Row]:
    """torch, its CUDA build, torch_npu and whether torch_npu was built for this torch."""
    try:
        import torch
    except ImportError as e:
        return [Row("torch", "fail", f"not importable: {e}", "pip install torch (on an NPU server: the version "
                                                             "your torch-npu names, see docs/ASCEND.md)")]
    tv = dist_version("torch") or torch.__version__  # a source build may have no distribution metadata
    rows = [Row("torch", "ok", tv)]
    cuda = torch.version.cuda
    rows.append(Row("cuda", "info", f"torch built with CUDA {cuda}" if cuda else "CPU-only torch build (no CUDA)"))
    nv = dist_version("torch-npu")
    if nv is None:
        rows.append(Row("torch_npu", "info", "not installed (needed only on Ascend NPUs)"))
        return rows
    t, n = release(tv), release(nv)
    if t != n:
        rows.append(Row("torch_npu", "fail", f"torch_npu {nv} is built for torch {_fmt(n)}, but torch is {tv}",
                        f"install the torch that torch_npu names: pip install 'torch=={_fmt(n)}' (on x86 from "
                        f"the PyTorch CPU index, as torch=={_fmt(n)}+cpu), or a torch-npu {_fmt(t)}.* for "
                        f"this torch"))
    else:
        rows.append(Row("torch_npu", "ok", f"{nv} (matches torch {_fmt(t)})"))
    return rows


def _record_hash(path: Path) -> str:
    """A file's hash as a wheel's RECORD writes it (urlsafe base64 sha256, no padding)."""
    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def module_owner(origin: str, names: tuple[str, ...] = ("triton", "triton-ascend")) -> str | None:
    """Which distribution wrote the file ``origin`` (``triton/__init__.py``) last.

    triton and triton-ascend install the same directory; the file's hash against each
    one's RECORD says whose copy is on disk now.
    """
    try:
        actual = _record_hash(Path(origin))
    except OSError:
        return None
    for name in names:
        try:
            files = metadata.distribution(name).files or []
        except metadata.PackageNotFoundError:
            continue
        for f in files:
            if f.parts[-2:] == ("triton", "__init__.py") and f.hash is not None:
                if f"{f.hash.mode}={f.hash.value}" == actual:
                    return name
    return None


def _requires_triton(name: str) -> bool:
    try:
        reqs = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return False
    return any(re.match(r"triton\b(?!-)", r) for r in reqs)


def triton_rows(kind: str) -> list[Row]:
    """triton / triton-ascend: which one provides the module ``triton``, and whether it suits ``kind``."""
    tv, av = dist_version("triton"), dist_version("triton-ascend")
    spec = importlib.util.find_spec("triton")
    origin = spec.origin if spec is not None else None
    if origin is None:
        fix = (f"install {TRITON_ASCEND_PIN} (in a venv without triton)" if kind == "npu" else
               "pip install -e '.[sim]' (triton for CPU and CUDA)")
        return [Row("triton", "fail", "the module `triton` is not importable", fix)]
    if tv and av:
        owner = module_owner(origin)
        whose = f"files of {owner}" if owner else "files of neither distribution's RECORD"
        if owner == "triton-ascend" and _requires_triton("triton-ascend"):
            return [Row("triton", "warn", f"triton {tv} and triton-ascend {av} both installed, as triton-ascend "
                                          f"{av} intends: the module `triton` comes from {origin} ({whose})",
                        "never reinstall or upgrade triton in this venv: it would overwrite triton-ascend")]
        return [Row("triton", "fail", f"triton and triton-ascend both installed: the module `triton` comes "
                                      f"from {origin} ({whose}); triton {tv}, triton-ascend {av}",
                    f"keep one per venv: for NPUs `pip uninstall -y triton triton-ascend && pip install "
                    f"{TRITON_ASCEND_PIN}`; for CPU / CUDA `pip uninstall -y triton-ascend triton && "
                    f"pip install -e '.[sim]'`")]
    if av:
        row = Row("triton", "ok", f"triton-ascend {av} ({origin})")
        if kind == "cuda":
            row = Row("triton", "fail", f"triton-ascend {av} provides `triton` ({origin}) but kernels run on cuda",
                      "use a venv with upstream triton for GPUs: pip install -e '.[sim]'")
        return [row]
    name = f"triton {tv}" if tv else "triton (no distribution metadata)"
    if kind == "npu":
        return [Row("triton", "fail", f"{name} ({origin}) cannot compile for Ascend NPUs",
                    f"in an NPU venv: pip uninstall -y triton && pip install {TRITON_ASCEND_PIN}")]
    return [Row("triton", "ok", f"{name} ({origin})")]


# ---- devices, environment, backend -----------------------------------------------

def npu_row(requested: str) -> Row:
    if dist_version("torch-npu") is None:
        if requested == "npu":
            return Row("npu", "fail", "torch_npu is not installed",
                       "install CANN, then the torch-npu built for this torch (docs/ASCEND.md)")
        return Row("npu", "info", "none (torch_npu not installed)")
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
        import torch
        count = torch.npu.device_count() if torch.npu.is_available() else 0
        name = torch.npu.get_device_name(0) if count else ""
    except Exception as e:  # noqa: BLE001  (a broken CANN install shows here; doctor reports, never raises)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return Row("npu", "fail", f"import torch_npu failed: {type(e).__name__}: {first}",
                   "source CANN's set_env.sh (/usr/local/Ascend/ascend-toolkit/set_env.sh; from CANN 8.5 "
                   "/usr/local/Ascend/cann/set_env.sh) and install the torch-npu built for this torch")
    if count == 0:
        return Row("npu", "fail" if requested == "npu" else "warn", "torch_npu imports but sees no NPU",
                   "check `npu-smi info` and ASCEND_RT_VISIBLE_DEVICES")
    return Row("npu", "ok", f"{count} x {name}")


def cuda_row(requested: str) -> Row:
    import torch
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        status = "fail" if requested == "cuda" else "info"
        return Row("cuda devices", status, "none visible",
                   "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES" if status == "fail" else "")
    n = torch.cuda.device_count()
    return Row("cuda devices", "ok", f"{n} x {torch.cuda.get_device_name(0)}")


def env_rows(kind: str, environ: dict | None = None) -> list[Row]:
    """``environ``: the environment as the user gave it (choosing the cpu device sets TRITON_INTERPRET)."""
    environ = os.environ if environ is None else environ
    rows = []
    for var in ENV_VARS:
        value = environ.get(var)
        row = Row(f"${var}", "info", "unset" if value is None else repr(value))
        if var == "TRITON_INTERPRET" and value == "1" and kind in ("npu", "cuda"):
            row = Row(row.check, "warn", f"'1': kernels would run in the interpreter, not compiled for {kind}",
                      "unset TRITON_INTERPRET")
        rows.append(row)
    return rows


def device_rows(requested: str, local_rank: int = 0, local_world: int = 1, oversubscribe: bool = False):
    """(rows, DeviceChoice or None): the device this process's kernels run on and the torchrun backend.

    The choice is ``cpsim.run.dist.select_device``'s, the same code ``cpsim run`` uses.
    """
    import torch

    from cpsim.run import dist
    rows = [npu_row(requested), cuda_row(requested)]
    try:
        dev = dist.select_device(requested, local_rank, local_world, oversubscribe)
    except ConfigError as e:
        rows.append(Row("device", "fail", f"--device {requested}: {e.rule}", "pick a device that is there "
                                                                             "(--device npu|cuda|cpu)"))
        return rows, None
    except Exception as e:  # noqa: BLE001  (torch_npu without CANN's libraries raises more than ImportError)
        first = (str(e).strip().splitlines() or [""])[0]
        rows.append(Row("device", "fail", f"--device {requested}: {type(e).__name__}: {first}"[:300],
                        "see the npu row: source CANN's set_env.sh, check `npu-smi info`"))
        return rows, None
    how = "Triton interpreter on the host" if dev.kind == "cpu" else "compiled kernels"
    rows.append(Row("device", "ok", f"{dev.device} ({how})"))
    if not torch.distributed.is_available():
        rows.append(Row("torchrun backend", "fail", "torch.distributed is not available in this torch build",
                        "install a torch built with distributed support"))
        return rows, dev
    available = getattr(torch.distributed, "is_backend_available", None)
    if available is not None and not available(dev.backend):
        rows.append(Row("torchrun backend", "fail", f"{dev.backend} is not available in this torch",
                        "install torch_npu (hccl) or a CUDA torch (nccl), or pass --oversubscribe (gloo)"))
        return rows, dev
    detail = f"{dev.backend} on {dev.kind}"
    if dev.kind != "cpu" and local_world == 1:
        mod = torch.npu if dev.kind == "npu" else torch.cuda
        count = mod.device_count()
        over = dist.select_device(requested, 0, count + 1, True)
        detail += (f", one rank per device up to {count} ranks per node; more ranks need --oversubscribe "
                   f"({over.backend} on host copies)")
    elif dev.oversubscribed:
        detail += " (oversubscribed: collectives on host copies)"
    rows.append(Row("torchrun backend", "ok", detail))
    return rows, dev


# ---- kernels ---------------------------------------------------------------------

# (path, kernel design, CP size): every built-in kernel. v1-fused exists at CP 1 only;
# v1-torch is the DCP torch path, the same for both designs.
KERNEL_CHECKS = (
    ("v1", "per-request", 2), ("v1", "tile", 2),
    ("v1-fused", "per-request", 1), ("v1-fused", "tile", 1),
    ("v2", "per-request", 2), ("v2", "tile", 2),
    ("v1-torch", "per-request", 2),
)


def tiny_scenario(dcp: int):
    """Small enough for the interpreter, yet every feature the kernels branch on.

    Hybrid blocks (B 32 / b 16), an unsharded group next to a sharded one, prefill,
    decode and speculative tokens, a shuffled ``idx_mapping``, graph padding, and a
    cache of 2^27 blocks: block ids above 2^24 (not exact through fp32) and
    slots above 2^31 (not exact in int32) occur.
    """
    groups = (sc.KVGroup("attn", "attention", 32, 16, num_blocks=1 << 27),
              sc.KVGroup("local", "attention", 16, cp_sharded=False, num_blocks=256))
    limits = sc.Limits(max_model_len=512, max_num_reqs=4, max_num_batched_tokens=48, num_speculative_tokens=2)
    batch = sc.Batch((sc.Request(0, 21, "prefill"), sc.Request(37, 1, "decode"), sc.Request(300, 3, "spec")),
                     idx_mapping=(2, 0, 3), num_tokens_padded=30)
    return sc.validate(sc.Scenario("doctor", sc.CPConfig(dcp=dcp, interleave=4), groups, limits, batch))


def kernel_row(path: str, design: str, cp: int, device, fault: int = 0, runner=None) -> Row:
    """Run one built-in kernel on every virtual rank of a tiny scenario on ``device`` (on ``runner``:
    ``run_virtual``'s); exact or not."""
    from cpsim.allocator import allocate_world
    from cpsim.check import coordinator
    from cpsim.paths import Knobs
    from cpsim.run import world

    name = f"kernel {path}" + ("" if path == "v1-torch" else f" {design}")
    s = tiny_scenario(cp)
    start = time.perf_counter()
    try:
        gathered = world.run_virtual(s, [path], Knobs(kernel_fault=fault, kernel_design=design), device=device,
                                     runner=runner)
    except Exception as e:  # noqa: BLE001  (a compile error is this check's finding, reported as a row)
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
        return Row(name, "fail", f"does not compile or run on {device}: {type(e).__name__}: {first}"[:300],
                   f"see the whole error with `cpsim run --paths {path} --kernel-design {design} "
                   f"--device {torch_device_type(device)}`; check the triton row", time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if path not in gathered:
        return Row(name, "fail", f"path {path} did not run at CP {cp}", "report this as a cpsim bug", seconds)
    verdicts = coordinator.check(s, allocate_world(s), gathered, [s.fingerprint()] * s.cp.world)
    bad = [v for v in verdicts if v.status == "fail"]
    if bad:
        v = bad[0]
        what = v.violations[0].message if v.violations else ""
        return Row(name, "fail", f"wrong slots on {device}: {v.invariant}: {what}"[:300],
                   f"the kernel misbehaves on this device: `cpsim run --paths {path} --kernel-design {design} "
                   f"--device {torch_device_type(device)}` shows every violation", seconds)
    n = next(v.checked for v in verdicts if v.invariant == "matches-reference")
    return Row(name, "ok", f"exact on {device}, CP {cp}: {n} entries match the reference "
                                  f"(block ids > 2^24, slots > 2^31)", seconds=seconds)


def torch_device_type(device) -> str:
    return getattr(device, "type", str(device).split(":")[0])


def kernel_rows(device, fault: int = 0, runner=None) -> list[Row]:
    """``kernel_row`` for each of ``KERNEL_CHECKS``, on one runner (the caller's, else one of their own)."""
    from cpsim.run.runner import given
    with given(runner) as r:
        return [kernel_row(path, design, cp, device, fault, r) for path, design, cp in KERNEL_CHECKS]


# ---- everything --------------------------------------------------------------------

def collect(requested: str = "auto", local_rank: int = 0, local_world: int = 1, oversubscribe: bool = False,
            kernels: bool = True, fault: int = 0, runner=None):
    """(rows, DeviceChoice or None): every check of this process, in the order the table shows them.

    ``fault``: FAULT_* bits compiled into the kernels under check (tests only); ``runner``: the kernel
    checks' (``kernel_rows``).
    """
    given = dict(os.environ)
    rows = [python_row(), *torch_rows()]
    dev_rows, dev = device_rows(requested, local_rank, local_world, oversubscribe)
    rows += dev_rows
    rows += triton_rows(dev.kind if dev is not None else requested)
    rows += env_rows(dev.kind if dev is not None else requested, given)
    if not kernels:
        rows.append(Row("kernels", "info", "skipped (--skip-kernels)"))
    elif dev is None:
        rows.append(Row("kernels", "fail", "not run: no usable device", "fix the device row first"))
    elif failed([r for r in rows if r.check == "triton"]):
        rows.append(Row("kernels", "fail", "not run: no usable triton", "fix the triton row first"))
    else:
        rows += kernel_rows(dev.device, fault, runner)
    return rows, dev


def exit_code(rows: list[Row]) -> int:
    return 1 if failed(rows) else 0


@dataclass
class Merged:
    """One printed row: a check's result shared by ``ranks``."""

    row: Row
    ranks: list[int] = field(default_factory=list)


def merge(per_rank: list[list[Row]]) -> list[Merged]:
    """Rows equal on several ranks print once, with the ranks they hold on; order of first appearance."""
    out: list[Merged] = []
    index: dict[tuple, Merged] = {}
    order: list[str] = []
    for rows in per_rank:
        for r in rows:
            if r.check not in order:
                order.append(r.check)
    for check in order:
        for rank, rows in enumerate(per_rank):
            for r in rows:
                if r.check != check:
                    continue
                m = index.get(r.key())
                if m is None:
                    m = index[r.key()] = Merged(r)
                    out.append(m)
                m.ranks.append(rank)
    return out


def rank_list(ranks: list[int], world: int) -> str:
    if len(ranks) == world:
        return "all"
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(parts)

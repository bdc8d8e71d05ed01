"""Adapter conformance: cpsim's adapter for a release's ABI launches the kernel exactly as the release's host does.

A release's host classes run in the stack driver child with a :class:`cpsim.stack.recording_kernel.RecordingKernel`
in place of their slot-mapping kernel (``kernel_sites`` of the family's adapter module); cpsim's
adapter (:mod:`cpsim.paths.adapters`) launches a recorder of the same parameter names for the same
scenario, rank and block ids. The two records are compared argument by argument (:func:`compare`):
grid, every scalar and flag, every tensor's dtype, shape and values, the tables a pointer table points
at (their row stride and the live entries of the rows the launch reads), the slot buffer's dtype and
length. Any difference is a ``conformance`` failure of the release naming the ABI, the argument and
both values (``make upstream-check``).

What is not compared, and why (docs/UPSTREAM.md, "Adapter conformance"): addresses (they differ between
processes; what they point at is compared), the slot buffer's contents (cpsim poisons it, the host
zero-fills it: an output, not an input), table entries past a row's live blocks (cpsim's guard ids vs the
host's zeros: a kernel reads them only past the row's blocks, which ``row-bounds`` judges), and a stride
argument's value where it is the row stride of the tensor it describes in both (cpsim's buffers sit inside
guard entries; the relation is what a kernel relies on).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from cpsim import scenario as sc
from cpsim.allocator import Allocation
from cpsim.errors import ConfigError
from cpsim.kernels import under_test
from cpsim.kernels.abi_match import choose_abi
from cpsim.paths import adapters
from cpsim.paths.prep import PerRank
from cpsim.paths.types import Knobs
from cpsim.presets import preset
from cpsim.stack import recording_kernel
from cpsim.stack.host import kv_manager_blocks

OUTPUT_ARGS = ("slot_mapping_ptr", "slot_mappings_ptr")  # the slot buffer: its contents are the kernel's output
ORIGIN = {"vllm": "vllm", "vllm-ascend": "vllm_ascend"}  # the package a family's MRV2 kernel file is of


@dataclass(frozen=True)
class Difference:
    """One argument (or the grid, or the number of launches) that differs: ``host`` is what the release's
    host passed, ``cpsim`` what cpsim's adapter passed."""

    launch: int
    argument: str
    host: str
    cpsim: str

    def line(self) -> str:
        return f"launch {self.launch}: {self.argument}: release passes {self.host}, cpsim's adapter {self.cpsim}"


def scenarios() -> list[tuple[str, sc.Scenario]]:
    """The conformance set: graph padding with kernel blocks and a state group (``default``, DCP 4), MTP
    drafts (``mtp``, its batch within the release's token budget), a replicated group with graph padding
    (``released-window``), kernel blocks of a quarter / eighth of B with a wide interleave
    (``hybrid-interleave``), partial replicas (``partial-replica``: refused where the release has none) and
    dummy requests with tokens (``dummy rows``: MRV2 of releases whose kernel skips idx_mapping -1)."""
    mtp = preset("mtp")
    lim = dataclasses.replace(mtp.limits, max_num_batched_tokens=max(mtp.batch.num_tokens, mtp.batch.num_tokens_padded))
    return [("default dcp4", preset("default", dcp=4)),
            ("mtp", dataclasses.replace(mtp, limits=lim)),
            ("released-window", preset("released-window")),
            ("hybrid-interleave", preset("hybrid-interleave")),
            ("partial-replica", preset("partial-replica")),
            ("dummy rows", dummy_rows())]


def dummy_rows() -> sc.Scenario:
    """``graph-padding``'s batch without its padded drafts: two dummy requests (idx_mapping -1) with
    tokens beside real ones, as vLLM 0.33.0's speculator hands its CUDA-graph-padded rows to the kernel."""
    s = preset("graph-padding")
    reqs = tuple(dataclasses.replace(r, padded_drafts=0) for r in s.batch.requests)
    return dataclasses.replace(s, batch=dataclasses.replace(s.batch, requests=reqs))


def release_abi(launches: list[dict], family: str, release: str, own_release: str = "") -> str:
    """The ABI cpsim detects for the release's kernel from the parameter names the host launched it with:
    a vllm-ascend MRV2 kernel by the vllm-ascend release (``own_release``), a vLLM kernel by the vLLM one."""
    params = [(n, False) for n in launches[0]["params"]]
    origin = ORIGIN[family] if launches[0]["kernel"] == "_compute_slot_mappings_kernel" else "vllm"
    return choose_abi(params, True, origin, release=own_release if origin == "vllm_ascend" else release)


def adapter_launches(s: sc.Scenario, path: str, rank: int, abi: str, params: list[str]) -> list[dict]:
    """cpsim's adapter for ``abi`` launching a recorder for ``rank`` of ``s``, with the block ids the
    release's KV manager hands every rank (:func:`cpsim.stack.host.kv_manager_blocks`), in one launch for
    every group as the releases do (``single``)."""
    launches: list = []
    kernel = recording_kernel.RecordingKernel("recorder", params, launches)
    k = under_test.KernelUnderTest("conformance recorder", kernel, abi, tuple(params), "single", path=path)
    allocs = [Allocation(tuple(kv_manager_blocks(s, gi))) for gi in range(len(s.groups))]
    adapters.run(k, path, s, allocs, rank, PerRank(s, "cpu"), Knobs())
    return launches


def facts(launch: dict, blocks: list[list[list[int]]] | None = None) -> dict[str, str]:
    """A launch as ``{argument: comparable text}`` (what is compared and what is not: the module docstring)."""
    args = launch["args"]
    out = {"grid": str(launch["grid"])}
    strides = _strides(args)
    for name, a in args.items():
        if a["type"] != "tensor":
            value = a.get("value")
            out[name] = strides.get((name, value)) or f"{a['type']} {value}"
            continue
        text = f"{a['dtype']} {a['shape']}"
        if name in OUTPUT_ARGS:
            out[name] = text
        elif "tables" in a:
            out[name] = f"{a['dtype']} {a['shape']}"
            for t, table in enumerate(a["tables"]):
                out[f"{name}[{t}] row stride"] = str(table["stride"])
                out[f"{name}[{t}] entries"] = _table_text(table["rows"], blocks)
        elif "rows" in a:
            out[name] = f"{text}"
            out[f"{name} entries"] = _table_text(a["rows"], blocks)
        elif name == "block_table_strides" and "tables" in args.get("block_table_ptrs", {}):
            same = a["values"] == [t["stride"] for t in args["block_table_ptrs"]["tables"]]
            out[name] = f"{text} " + ("= the tables' row strides" if same else str(a["values"]))
        else:
            out[name] = f"{text} {a.get('values')}"
    return out


def _strides(args: dict) -> dict[tuple[str, int], str]:
    """An int argument named ``*stride*`` that is the row stride of a tensor argument, said as that relation."""
    out = {}
    for name, a in args.items():
        if a["type"] == "int" and "stride" in name:
            for other, t in args.items():
                if t["type"] == "tensor" and len(t["stride"]) == 2 and t["stride"][0] == a["value"]:
                    out[(name, a["value"])] = f"row stride of {other}"
                    break
    return out


def _table_text(rows: dict[str, list[int]], blocks) -> str:
    """The live entries (up to the first 0) of each read row, and what they are: the physical ids of a
    request, or its kernel-block ids (physical id q as q*BPK .. q*BPK+BPK-1)."""
    parts = []
    for r in sorted(rows, key=int):
        live = []
        for x in rows[r]:
            if x == 0:
                break
            live.append(x)
        parts.append(f"row {r}: {_kind(live, blocks)} {live[:8]}{'...' if len(live) > 8 else ''} ({len(live)} live)")
    return "; ".join(parts)


def _kind(live: list[int], blocks) -> str:
    if not live or blocks is None:
        return ""
    for group in blocks:
        for ids in group:
            if len(ids) and live == list(ids):
                return "physical"
            if len(ids) and len(live) % len(ids) == 0 and len(live) > len(ids):
                bpk = len(live) // len(ids)
                if live == [q * bpk + j for q in ids for j in range(bpk)]:
                    return f"kernel-block (x{bpk})"
    return "other"


def compare(host: list[dict], mine: list[dict], blocks=None) -> list[Difference]:
    """Argument by argument, launch by launch: every difference (an empty list: the adapter conforms)."""
    out = []
    if len(host) != len(mine):
        out.append(Difference(-1, "launches", str(len(host)), str(len(mine))))
    for i, (h, m) in enumerate(zip(host, mine)):
        fh, fm = facts(h, blocks), facts(m, blocks)
        for name in list(fh) + [n for n in fm if n not in fh]:
            a, b = fh.get(name, "(not passed)"), fm.get(name, "(not passed)")
            if a != b:
                out.append(Difference(i, name, a, b))
    return out


def job_blocks(s: sc.Scenario) -> list[list[list[int]]]:
    """Every group's block ids per request, as the stack driver hands them to the release."""
    return [[list(map(int, b)) for b in kv_manager_blocks(s, gi)] for gi in range(len(s.groups))]


def judge(s: sc.Scenario, path: str, rank: int, family: str, release: str, host: list[dict],
          own_release: str = "") -> tuple[str, list[Difference]]:
    """(the ABI, the differences) of one path and rank of ``s``: no host launch (a torch path) is no ABI."""
    if not host:
        return "", []
    abi = release_abi(host, family, release, own_release)
    mine = adapter_launches(s, path, rank, abi, host[0]["params"])
    return abi, compare(host, mine, job_blocks(s))


def launches_of(arrays: dict, k: int, path: str, rank: int) -> list[dict] | None:
    """The driver's record of one job, path and rank (None when it sent none)."""
    data = arrays.get(f"j{k}/{path}_r{rank}_launches")
    return None if data is None else recording_kernel.from_bytes(np.asarray(data))


def job_rows(label: str, family: str, vllm_version: str, name: str, job, paths, make_row) -> list[dict]:
    """The matrix rows (``make_row``: scripts/upstream_check.py's ``row``) of one recorded job: per path, pass
    or fail naming every differing argument (the first rank that differs, its differences in the detail)."""
    if job.unsupported:
        return [make_row(label, "conformance", name, ",".join(paths), "not expressible",
                         detail=f"{job.unsupported[0]}: {job.unsupported[1]}")]
    out = []
    for path in paths:
        if path in job.unsupported_paths:
            out.append(make_row(label, "conformance", name, path, "not expressible",
                                detail=": ".join(job.unsupported_paths[path])))
        elif path in job.failures:
            out.append(make_row(label, "conformance", name, path, "broken", detail=job.failures[path].message))
        else:
            out.append(_path_row(label, family, vllm_version, name, job, path, make_row))
    return out


def _path_row(label, family, vllm_version, name, job, path, make_row) -> dict:
    ranks = sorted(int(key.rsplit("_r", 1)[1]) for key in job.launches if key.startswith(f"{path}_r"))
    if not any(job.launches[f"{path}_r{r}"] for r in ranks):
        return make_row(label, "conformance", name, path, "not expressible",
                        detail="the release's host launches no slot-mapping kernel here (slots mapped on the host)")
    abi = ""
    for r in ranks:
        try:
            abi, diffs = judge(job.scenario, path, r, family, vllm_version, job.launches[f"{path}_r{r}"],
                               label.split()[1] if family == "vllm-ascend" else vllm_version)
        except ConfigError as e:  # cpsim cannot name an ABI for the release's kernel: a conformance failure
            return make_row(label, "conformance", name, path, "fail", ["abi"], detail=f"rank {r}: {e.rule}")
        if diffs:
            detail = f"{abi}, rank {r}: " + "; ".join(d.line() for d in diffs[:3]) + \
                     (f"; {len(diffs) - 3} more" if len(diffs) > 3 else "")
            return make_row(label, f"conformance ({abi})", name, path, "fail",
                            sorted({d.argument for d in diffs}), detail=detail)
    return make_row(label, f"conformance ({abi})", name, path, "pass", detail=f"{len(ranks)} rank(s) identical")

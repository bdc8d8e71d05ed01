"""Slot-mapping kernels on a GPU: tile-parallel vs per-request vs plain torch.

Per-call time (all groups of one rank) inside a CUDA graph and eager, medians of
many replays, for decode / spec / mixed / prefill shapes at CP 1 and 8 with 1 and
4 KV-cache groups. Every kernel's output is first checked against the torch
version entry by entry (poisoned buffer, whole buffer compared).

    python3 scripts/bench_kernels.py --out bench.json            # on the GPU
    python3 scripts/bench_kernels.py --smoke                     # CPU interpreter, tiny shapes, exactness only

Floor per call: the fewest bytes (positions, query_start_loc, idx_mapping and the
table entries read once; every slot written once as int64) at 4.3 TB/s plus
1.1 us for one launch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import zlib
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

BW = 4.3e12
LAUNCH_US = 1.1
PAD = -1
POISON = -7777

SHAPES = {  # name: (requests, tokens per request, prefill?)
    "decode-256x1": (256, 1, False),
    "spec-256x4": (256, 4, False),
    "mixed-32x256": (32, 256, False),
    "prefill-32K": (1, 32 << 10, True),
    "prefill-128K": (1, 128 << 10, True),
    "prefill-1M": (1, 1 << 20, True),
}
SMOKE_SHAPES = {"decode-8x1": (8, 1, False), "mixed-3x40": (3, 40, False), "prefill-300": (1, 300, True)}


@dataclass(frozen=True)
class G:
    B: int           # physical block size
    b: int           # kernel block size
    sharded: bool
    circular: bool = False

    @property
    def bpk(self) -> int:
        return self.B // self.b


GROUPS = {1: [G(128, 128, True)],
          4: [G(128, 128, True), G(128, 64, True), G(64, 64, False, True), G(16, 16, True)]}
INTERLEAVE = 16


def cdiv(a, b):
    return -(-a // b)


def next_pow2(x):
    return 1 << max(x - 1, 0).bit_length()


class Case:
    """One (shape, CP, groups) input set on the device, v1 and v2 table layouts."""

    def __init__(self, torch, dev, shape, cp, ngroups, seed):
        R, q, prefill = shape
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.R, self.T = R, R * q
        ctx = torch.zeros(R, dtype=torch.int64) if prefill else torch.randint(0, 32000, (R,), generator=gen)
        self.mml = int((ctx + q).max()) + 1
        qsl = torch.arange(R + 1, dtype=torch.int64) * q
        pos = ctx.repeat_interleave(q) + torch.arange(self.T) % q
        self.cp, self.rank = cp, (3 if cp > 1 else 0)
        self.groups = GROUPS[ngroups]
        self.qsl = qsl.to(torch.int32).to(dev)
        self.pos = pos.to(dev)
        self.idx = torch.randperm(R, generator=gen).to(torch.int32).to(dev)
        self.phys, self.logical = [], []
        for g in self.groups:
            n = cp if g.sharded else 1
            width = cdiv(self.mml, g.B * n)
            t = torch.randint(1, 1 << 22, (R, width), generator=gen, dtype=torch.int32)
            self.phys.append(t.to(dev))
            lt = (t.to(torch.int64).unsqueeze(-1) * g.bpk + torch.arange(g.bpk)).reshape(R, -1).to(torch.int32)
            # v1 rows are indexed by batch position; v2 rows by idx_mapping.
            self.logical.append(lt[self.idx.cpu().long()].contiguous().to(dev))
        i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=dev)  # noqa: E731
        self.ptrs = torch.tensor([t.data_ptr() for t in self.phys], dtype=torch.int64, device=dev)
        self.strides = torch.tensor([t.stride(0) for t in self.phys], dtype=torch.int64, device=dev)
        self.sizes = i32([g.B for g in self.groups])
        self.enabled = i32([1] * len(self.groups))
        self.cps = i32([cp if g.sharded else 1 for g in self.groups])
        self.circ = i32([int(g.circular) for g in self.groups])
        self.out = torch.full((len(self.groups), self.T), POISON, dtype=torch.int64, device=dev)

    def min_bytes(self, torch) -> int:
        """Fewest bytes one call must move (see the module docstring)."""
        n = self.T * 8 + (self.R + 1) * 4 + self.R * 4 + self.out.numel() * 8
        pos = self.pos
        req = torch.searchsorted(self.qsl[1:].long(), torch.arange(self.T, device=pos.device), right=True)
        for g in self.groups:
            n_cp = self.cp if g.sharded else 1
            if g.circular:
                entries = self.R
            else:
                vo = pos % (g.B * n_cp)
                mine = (vo // INTERLEAVE) % n_cp == (self.rank if n_cp > 1 else 0)
                k = pos // (g.B * n_cp)
                entries = int(torch.unique((req * (1 << 40) + k)[mine]).numel())
            n += entries * 4
        return n


# ---- the versions under test -------------------------------------------------

def torch_v2(torch, c: Case, out):
    """Plain torch, v2 semantics, graph-capturable (no host sync)."""
    t = torch.arange(c.T, device=out.device)
    req = torch.searchsorted(c.qsl[1:], t.to(torch.int32), right=True).clamp(max=c.R - 1)
    row = c.idx.long()[req]
    pos = c.pos
    tok = t < c.qsl[c.R]
    for gi, g in enumerate(c.groups):
        table = c.phys[gi]
        if g.circular:
            k = torch.zeros_like(pos)
            o, local = pos % g.B, pos >= 0
        elif g.sharded and c.cp > 1:
            virtual = g.B * c.cp
            vo = pos % virtual
            local = (vo // INTERLEAVE) % c.cp == c.rank
            k, o = pos // virtual, (vo // (c.cp * INTERLEAVE)) * INTERLEAVE + vo % INTERLEAVE
        else:
            k, o, local = pos // g.B, pos % g.B, pos >= 0
        w = table.shape[1]
        blk = table[row, k.clamp(max=w - 1)].long()
        blk = torch.where(k < w, blk, 0)
        out[gi] = torch.where(tok & local, blk * g.B + o, PAD)


def make_versions(torch, c: Case, tile: int | None = None, warps: int | None = None):
    from cpsim.kernels import window_size
    from cpsim.kernels.tile import plan, pow2_sizes
    from cpsim.kernels.tile_v1 import _tile_slot_mapping_kernel
    from cpsim.kernels.tile_v2 import _tile_slot_mappings_kernel
    from cpsim.kernels.triton_v1 import _compute_slot_mapping_kernel
    from cpsim.kernels.triton_v2 import _compute_slot_mappings_kernel

    dev = c.out.device.type
    p = plan(c.T, c.R, c.mml, dev, tile, warps)
    pow2 = pow2_sizes([g.B for g in c.groups], c.cp)
    Gn = len(c.groups)
    out = c.out

    def v2_tile():
        _tile_slot_mappings_kernel[p.grid(c.T)](
            c.T, c.T, c.R, c.idx, c.qsl, c.pos, c.ptrs, c.strides, c.sizes, out, out.stride(0), c.rank,
            CP_SIZE=c.cp, CP_INTERLEAVE=INTERLEAVE, PAD_ID=PAD, TRITON_BLOCK_SIZE=p.tile,
            slot_mapping_enabled=c.enabled, group_cp_sizes=c.cps, is_circular=c.circ,
            NUM_GROUPS=Gn, GROUP_BLOCK=next_pow2(Gn), REQ_BLOCK=p.req_block, POS_INT32=p.pos_int32,
            POW2=pow2, num_warps=p.num_warps)

    def v2_req():
        _compute_slot_mappings_kernel[(Gn, c.R + 1)](
            c.T, c.T, c.idx, c.qsl, c.pos, c.ptrs, c.strides, c.sizes, out, out.stride(0), c.rank,
            CP_SIZE=c.cp, CP_INTERLEAVE=INTERLEAVE, PAD_ID=PAD, TRITON_BLOCK_SIZE=1024,
            BLOCK_TABLE_WINDOW_SIZE=window_size(1024, min(g.B for g in c.groups)),
            slot_mapping_enabled=c.enabled, group_cp_sizes=c.cps, is_circular=c.circ, POS_INT32=p.pos_int32)

    def v1_args(gi, g):
        n = c.cp if g.sharded else 1
        t = c.logical[gi]
        return (c.T, c.T, c.qsl, c.pos, t, t.stride(0), g.b, out[gi]), dict(
            KV_CACHE_BLOCK_SIZE=g.B, BLOCKS_PER_KV_BLOCK=g.bpk, TOTAL_CP_WORLD_SIZE=n,
            TOTAL_CP_RANK=c.rank if n > 1 else 0, CP_KV_CACHE_INTERLEAVE_SIZE=INTERLEAVE, PAD_ID=PAD,
            IS_CIRCULAR=g.circular)

    v1 = [v1_args(gi, g) for gi, g in enumerate(c.groups)]

    def v1_tile():
        for (a, kw) in v1:
            _tile_slot_mapping_kernel[p.grid(c.T)](*a[:2], c.R, *a[2:], **kw, TILE=p.tile, REQ_BLOCK=p.req_block,
                                                   POS_INT32=p.pos_int32, num_warps=p.num_warps)

    def v1_req_with(pos_int32: bool):
        # pos_int32=False is what the paths launch when max_model_len >= 2**31: position math in int64.
        def run():
            for (a, kw), g in zip(v1, c.groups):
                _compute_slot_mapping_kernel[(c.R + 1,)](*a, **kw, TILE_BLOCK_SIZE=1024,
                                                         BLOCK_TABLE_WINDOW_SIZE=window_size(1024, g.b),
                                                         POS_INT32=pos_int32)
        return run

    v1_req, v1_req_int64 = v1_req_with(p.pos_int32), v1_req_with(False)

    return {"v2-tile": v2_tile, "v2-req": v2_req, "v1-tile": v1_tile, "v1-req": v1_req, "v1-req-i64": v1_req_int64,
            "torch": lambda: torch_v2(torch, c, out)}, p


def check(torch, c: Case, fn, want) -> bool:
    c.out.fill_(POISON)
    fn()
    return bool(torch.equal(c.out, want))


# ---- timing --------------------------------------------------------------------

def time_graph(torch, fn, launches: int, replays: int) -> float:
    """Median us per call: ``launches`` calls captured in one graph, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(launches):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / launches)
    del g
    return statistics.median(times)


def time_eager(torch, fn, launches: int, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(launches):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / launches)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write all numbers as JSON here")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter: tiny shapes, exactness only")
    ap.add_argument("--shapes", default="", help="comma-separated subset of shapes")
    ap.add_argument("--sweep", default="16/1,32/1,32/2,64/1,64/2,64/4,128/2,128/4,256/4,512/4,512/8,1024/8",
                    help="TILE/num_warps pairs to sweep for v2-tile and v1-tile at CP 8")
    ap.add_argument("--replays", type=int, default=30)
    args = ap.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton

    dev = "cpu" if args.smoke else "cuda"
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    if args.shapes:
        shapes = {k: v for k, v in shapes.items() if k in args.shapes.split(",")}
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "command": " ".join(sys.argv),
            "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)"}
    print(json.dumps(meta), flush=True)
    rows = []
    sweep = [tuple(int(v) for v in x.split("/")) for x in args.sweep.split(",") if x]
    for sname, shape in shapes.items():
        for cp in (1, 8):
            for ng in (1, 4):
                c = Case(torch, dev, shape, cp, ng, seed=zlib.crc32(f"{sname}/{cp}/{ng}".encode()))
                nbytes = c.min_bytes(torch)
                floor = nbytes / BW * 1e6 + LAUNCH_US
                versions, p = make_versions(torch, c)
                want = c.out.clone()
                c.out.fill_(POISON)
                versions["torch"]()
                want = c.out.clone()
                assert not bool((want == POISON).any()), "torch version left entries unwritten"
                extra = {}
                if cp == 8:
                    for t, w in sweep:
                        vs = make_versions(torch, c, t, w)[0]
                        extra[f"v2-tile@{t}/{w}"] = vs["v2-tile"]
                        if ng == 1:
                            extra[f"v1-tile@{t}/{w}"] = vs["v1-tile"]
                big = nbytes > (1 << 20)
                launches = 8 if big else 64
                for name, fn in {**versions, **extra}.items():
                    ok = check(torch, c, fn, want)
                    row = {"shape": sname, "cp": cp, "groups": ng, "version": name, "exact": ok,
                           "bytes": nbytes, "floor_us": round(floor, 3), "tile": p.tile}
                    if not args.smoke:
                        row["graph_us"] = round(time_graph(torch, fn, launches, args.replays), 3)
                        if "@" not in name:
                            row["eager_us"] = round(time_eager(torch, fn, launches, 7), 3)
                        row["GBps"] = round(nbytes / (row["graph_us"] * 1e-6) / 1e9, 1)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                del c, versions, extra
                if dev == "cuda":
                    torch.cuda.empty_cache()
    bad = [r for r in rows if not r["exact"]]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print_table(rows)
    print(f"{len(rows)} rows, {len(bad)} inexact", flush=True)
    return 1 if bad else 0


def print_table(rows) -> None:
    main_v = ["v2-tile", "v2-req", "v1-tile", "v1-req", "torch"]
    keys = sorted({(r["shape"], r["cp"], r["groups"]) for r in rows}, key=lambda k: (list(SHAPES).index(k[0])
                  if k[0] in SHAPES else 0, k[1], k[2]))
    print("shape cp groups floor_us | " + " | ".join(f"{v} graph/eager" for v in main_v))
    for k in keys:
        rs = {r["version"]: r for r in rows if (r["shape"], r["cp"], r["groups"]) == k}
        floor = next(iter(rs.values()))["floor_us"]
        cells = []
        for v in main_v:
            r = rs.get(v)
            cells.append("-" if r is None else f"{r.get('graph_us', '?')}/{r.get('eager_us', '?')}"
                         + ("" if r["exact"] else " WRONG"))
        print(f"{k[0]} {k[1]} {k[2]} {floor} | " + " | ".join(cells))


if __name__ == "__main__":
    sys.exit(main())

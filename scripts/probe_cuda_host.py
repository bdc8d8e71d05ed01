"""Host cost on a CUDA machine: what single operations cost (a Triton launch, an upload, a read-back,
...), then where an in-process fuzz scenario's time goes (wall time per cpsim function, wrapped with
timers rather than profiled, so Python-heavy code is not inflated; 150 default-space scenarios, seed 0,
three passes, the last one reported).

    PYTHONPATH=$PWD python3 scripts/probe_cuda_host.py      # on the GPU machine, TRITON_INTERPRET unset
"""
import collections
import functools
import json
import os
import time

import numpy as np
import torch

dev = torch.device("cuda")
res = {}

def per_call(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6

import triton
import triton.language as tl


@triton.jit
def k(a, b, c, d, e, f, g, h, out, n, s, X: tl.constexpr, Y: tl.constexpr, Z: tl.constexpr):
    pid = tl.program_id(0)
    tl.store(out + pid, pid)

out = torch.zeros(64, dtype=torch.int64, device=dev)
args = [torch.zeros(16, dtype=torch.int32, device=dev) for _ in range(8)]
small = torch.zeros((2, 4096), dtype=torch.int64, device=dev)
host8 = [np.arange(40, dtype=np.int32) for _ in range(8)]
from cpsim.paths._inputs import upload

idx = torch.arange(0, 100, dtype=torch.int64, device=dev)
pinned = torch.empty(8192, dtype=torch.int64, pin_memory=True)
res["triton_launch_12args_us"] = per_call(lambda: k[(4,)](*args, out, 5, 7, X=1, Y=2, Z=3))
res["torch_full_2x4096_us"] = per_call(lambda: torch.full((2, 4096), -7, dtype=torch.int64, device=dev))
res["fill__us"] = per_call(lambda: small.fill_(3))
res["h2d_1kb_pageable_us"] = per_call(lambda: torch.from_numpy(host8[0]).to(dev))
res["cpsim_upload_8_arrays_us"] = per_call(lambda: upload(host8, dev))
res["d2h_cpu_2x4096_sync_us"] = per_call(lambda: small.cpu())
res["d2h_nonblocking_pinned_us"] = per_call(lambda: pinned.copy_(small.view(-1), non_blocking=True))
res["index_put_us"] = per_call(lambda: small[0].index_put_((idx,), torch.tensor(-1, device=dev)))
res["sync_idle_us"] = per_call(lambda: torch.cuda.synchronize())
res["event_record_us"] = per_call(lambda: torch.cuda.Event().record())
# the parts of an upload, and the table and padding operations (eighth round)
res["pinned_empty_4kb_us"] = per_call(lambda: torch.empty(4096, dtype=torch.uint8, pin_memory=True))
res["pageable_empty_4kb_us"] = per_call(lambda: torch.empty(4096, dtype=torch.uint8))
pin4k = torch.empty(4096, dtype=torch.uint8, pin_memory=True)
res["h2d_4kb_pinned_nonblocking_us"] = per_call(lambda: pin4k.to(dev, non_blocking=True))
res["h2d_4kb_pageable_us"] = per_call(lambda: torch.empty(4096, dtype=torch.uint8).to(dev))
res["cpsim_upload_3_arrays_us"] = per_call(lambda: upload(host8[:3], dev))
rows = small[:, 16:4000]
pidx = torch.arange(0, 300, 3, dtype=torch.int64, device=dev)
res["setitem_advanced_2d_us"] = per_call(lambda: rows.__setitem__((slice(None), pidx), -1))
res["index_fill__2d_us"] = per_call(lambda: rows.index_fill_(1, pidx, -1))
flat = small.view(-1)
vals = torch.zeros(100, dtype=torch.int64, device=dev)
res["setitem_flat_index_us"] = per_call(lambda: flat.__setitem__(idx, vals))
res["index_put__flat_us"] = per_call(lambda: flat.index_put_((idx,), vals))
res["setitem_slice_zero_us"] = per_call(lambda: small.__setitem__((slice(None), slice(20, 60)), 0))
res["narrow_fill__us"] = per_call(lambda: small.narrow(1, 20, 40).fill_(0))
print(json.dumps(res, indent=1), flush=True)
if "--ops-only" in os.sys.argv:
    raise SystemExit(0)

# ---- instrumented fuzz ----
os.environ["CPSIM_KERNEL_ISOLATION"] = "0"
import tempfile
from pathlib import Path

from cpsim import fuzz as fz
from cpsim.run import isolation

isolation.configure(process=False)
T = collections.defaultdict(float)
C = collections.Counter()
def wrap(mod, name, label=None):
    owner = mod
    f = getattr(owner, name)
    label = label or f"{getattr(owner, '__name__', owner)}.{name}"
    @functools.wraps(f)
    def w(*a, **kw):
        t = time.perf_counter()
        try:
            return f(*a, **kw)
        finally:
            T[label] += time.perf_counter() - t
            C[label] += 1
    setattr(owner, name, w)
import cpsim.allocator as AL
import cpsim.check.coordinator as CO
import cpsim.fuzz as FZ
import cpsim.fuzz.space as SP
import cpsim.paths._guard as G
import cpsim.paths._inputs as In
import cpsim.paths.prep as S
import cpsim.paths.replay_padding as R
import cpsim.paths.v1 as V1
import cpsim.paths.v2 as V2
import cpsim.run.world as W

wrap(S.Stage, "table"); wrap(S.Stage, "batch"); wrap(S.Stage, "buffer")
wrap(G.Watch, "read_back"); wrap(G, "tables"); wrap(In, "upload")
wrap(V1, "mask_padding"); wrap(R, "pad"); wrap(V1, "run"); wrap(V2, "run"); wrap(V2, "run_mrv2")
wrap(CO, "check"); wrap(SP, "build"); wrap(AL, "allocate_world"); wrap(W, "stack"); wrap(W, "run_virtual")
wrap(FZ, "evaluate")
import triton.runtime.jit as J

wrap(J.JITFunction, "run", "triton.run")
# modules bound names at import: rebind
V1._guard = G; V2._guard = G
for kk in range(3):
    T.clear(); C.clear()
    cfg = fz.FuzzConfig(max_examples=150, seed=0, database=None, device="cuda", out=Path(tempfile.mkdtemp()))
    t = time.perf_counter()
    r = fz.search(cfg)
    w = time.perf_counter() - t
    print(f"pass {kk+1}: {r.examples} examples {r.examples / w:.1f}/s", flush=True)
n = r.examples
rows = sorted(T.items(), key=lambda x: -x[1])
print("per scenario (ms) / calls per scenario / us per call (last pass, instrumented):")
for k_, v in rows:
    print(f"  {k_:40s} {v / n * 1e3:7.3f} ms  {C[k_] / n:6.2f}  {v / C[k_] * 1e6:8.1f} us")
print(f"wall per scenario {w / n * 1e3:.3f} ms")

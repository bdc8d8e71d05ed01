"""Worker process of the Ascend compile check; runs in the triton-ascend side venv.

Reads one JSON request on stdin and answers with JSON lines on stdout:
``{"mode": "compile", "arch": ..., "jobs": [Job.to_json(), ...]}`` -> a ``{"start": i}`` line
before each job (so a crash is attributed to its job) and a ``{"i": i, "ok": ...}`` line after;
``{"mode": "inspect", "spec": ..., "path": ..., "abi": ...}`` -> one line with the kernel's
ABI and parameters (or the bad-input message).
"""

from __future__ import annotations

import json
import sys
import time

# All stdlib below their own tops (no numpy, pydantic, rich): the side venv holds triton-ascend and pybind11
# only, with cpsim's source folder put first on PYTHONPATH by cpsim.ascend_check.fan_out.
from cpsim.ascend_check.compiler import compile_kernel, is_triton_ascend
from cpsim.errors import ConfigError
from cpsim.kernels import abi_match
from cpsim.kernels import under_test as kut
from cpsim.kernels import vllm_shim


def _load(target: str, shim_vllm: bool, path: str = "", where: str = "kernel"):
    if shim_vllm:
        vllm_shim.install()
    return kut.resolve(target, path, where)


def _inspect(req: dict) -> dict:
    try:
        obj = _load(req["spec"], req.get("shim_vllm", False), req["path"], req["where"])
        if not abi_match.is_triton_kernel(obj):
            raise ConfigError(req["where"], f"{req['spec']} is not a Triton kernel (@triton.jit); only Triton "
                                            f"kernels are compiled for Ascend")
        abi = abi_match.detect_abi(obj, req.get("abi", "auto"), req["where"])
        if req["path"] not in abi_match.ABIS[abi].paths:
            raise ConfigError(req["where"], f"{req['spec']} has the {abi} ABI, which cannot stand in for the "
                                            f"{req['path']} path")
    except ConfigError as e:
        return {"bad_input": str(e)}
    fn = obj
    while not hasattr(fn, "params") and hasattr(fn, "fn"):
        fn = fn.fn  # autotuner / heuristics wrappers
    params = [{"name": p.name, "constexpr": bool(p.is_constexpr), "has_default": bool(p.has_default)}
              for p in getattr(fn, "params", [])]
    return {"abi": abi, "params": params}


def _compile(req: dict) -> None:
    if not is_triton_ascend():
        print(json.dumps({"fatal": "the `triton` module in this interpreter is not triton-ascend"}), flush=True)
        return
    loaded: dict = {}
    for i, job in req["jobs"]:
        print(json.dumps({"start": i}), flush=True)
        t = time.perf_counter()
        key = (job["target"], job.get("shim_vllm", False))
        try:
            if key not in loaded:
                loaded[key] = _load(job["target"], job.get("shim_vllm", False))
            fn = loaded[key]
            while not hasattr(fn, "params") and hasattr(fn, "fn"):
                fn = fn.fn
            out = compile_kernel(fn, job["signature"], job["constants"], req["arch"])
            res = {"i": i, "ok": out.ok, "stage": out.stage, "error": out.error}
        except Exception as e:  # noqa: BLE001 - a kernel that cannot even be loaded fails its jobs
            res = {"i": i, "ok": False, "stage": "load", "error": f"{type(e).__name__}: {e}".splitlines()[0]}
        res["seconds"] = round(time.perf_counter() - t, 3)
        print(json.dumps(res), flush=True)


def main() -> int:
    req = json.loads(sys.stdin.read())
    if req["mode"] == "inspect":
        print(json.dumps(_inspect(req)), flush=True)
    else:
        _compile(req)
    return 0


if __name__ == "__main__":
    sys.exit(main())

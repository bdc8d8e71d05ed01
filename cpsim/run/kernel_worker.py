"""The child side of kernel isolation: a loop that runs whole rank runs of a path.

It imports no Triton at module level (the forkserver preloads this module; Triton
must see ``TRITON_INTERPRET=1`` first, which ``prepare_triton`` sets for CPU
devices). Every reply is a tuple whose first item says what happened; anything
the kernel does that ends the process shows up on the parent's side as a closed
pipe and an exit status instead.
"""

from __future__ import annotations

from typing import Any

import os

import numpy as np
import torch

from cpsim.errors import ConfigError
from cpsim.paths import RankOutput, prep, run_path
from cpsim.run import reaper


def pack(out: RankOutput | None) -> dict[str, Any] | None:
    """A RankOutput as plain numpy data: pickles by value, whatever torch's sharing strategy."""
    if out is None:
        return None
    return {"slots": out.slots.detach().cpu().numpy(), "enabled": list(out.enabled), "widths": list(out.widths),
            "entry_sizes": list(out.entry_sizes),
            "guard": None if out.guard is None else out.guard.cpu().numpy(),
            "written": None if out.written is None else out.written.numpy(),
            "output_faults": out.output_faults}


def unpack(data: dict[str, Any] | None) -> RankOutput | None:
    if data is None:
        return None
    written = data.get("written")
    return RankOutput(torch.from_numpy(np.ascontiguousarray(data["slots"])), data["enabled"], data["widths"],
                      data["entry_sizes"], None if data["guard"] is None else torch.from_numpy(data["guard"]),
                      None if written is None else torch.from_numpy(written), data.get("output_faults"))


def _kernel(cache: dict, path: str, record: dict | None, device: str):
    if record is None:
        return None
    key = (path, repr(sorted(record.items())), device)
    if key not in cache:
        from cpsim.kernels.under_test import inspect_here, load_record
        cache[key] = load_record(record, path, device, where=f"kernel for {path}", inspect=inspect_here)
    return cache[key]


def main(fd: int, parent_pid: int, authkey: str) -> None:
    """The worker process's entry (``cpsim.run.isolation.Worker.spawn``): serve the parent over the
    socket ``fd``. ``authkey``: the parent's, under which torch's shared tensors are handed over."""
    import multiprocessing
    import signal
    from multiprocessing.connection import Connection
    multiprocessing.current_process().authkey = bytes.fromhex(authkey)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a run is interrupted
    reaper.become_subreaper()  # a kernel's orphaned (setsid, double-forked) child stays below this process
    try:
        serve(Connection(fd), parent_pid)
    finally:  # the parent closed the pipe or died: nothing the kernels started outlives this worker
        reaper.end_descendants()


def _probe(spec: str, path: str, shim_vllm: bool, device: str, where: str) -> tuple:
    """Import SPEC here and send back its signature as plain data (the parent never imports it)."""
    from cpsim.kernels.under_test import KernelImportError, inspect_here
    try:
        return ("sig", inspect_here(spec, path, shim_vllm, device, where).plain())
    except ConfigError as e:
        return ("config", e.field, e.rule)
    except KernelImportError as e:
        return ("unloaded", e.failure.kind, e.failure.message)
    except BaseException as e:  # noqa: BLE001  (reading the kernel's signature raised: its failure, named)
        return ("unloaded", "raised", f"raised {type(e).__name__} while its signature was read: {e}")


def _die_with(parent_pid: int) -> None:
    """End this process when the rank that started it is gone (killed, say): a kernel stuck
    in a sleep would otherwise outlive it, holding the launcher's output pipes open."""
    import threading
    import time

    def watch() -> None:
        while True:
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                try:
                    reaper.end_descendants()  # whatever the kernel forked, in any session
                    os.killpg(0, 9)  # and this process with its group
                finally:
                    os._exit(1)
            except PermissionError:
                pass
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True, name="cpsim-parent-watch").start()


def serve(conn, parent_pid: int | None = None) -> None:
    """Answer requests until the parent closes the pipe (or dies)."""
    if parent_pid is not None:
        _die_with(parent_pid)
    kernels: dict = {}
    loaded: tuple = (None, None, {})  # (token, scenario, rank -> allocations): the scenario in hand
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "prepare":
            conn.send(_prepare(*msg[1:]))
        elif msg[0] == "probe":
            conn.send(_probe(*msg[1:]))
        elif msg[0] == "run":
            conn.send(_run(kernels, *msg[1:]))
        elif msg[0] == "call":
            conn.send(_call(kernels, *msg[1:]))
        elif msg[0] == "load":
            loaded = msg[1:]
        elif msg[0] == "run_ranks":
            _run_ranks(conn, kernels, loaded, *msg[1:])


def _run_ranks(conn, kernels: dict, loaded: tuple, path: str, token: int, ranks: list[int], device: str,
               knobs: list, record: dict | None, batch: bool = False) -> None:
    """Every listed rank of one path of the loaded scenario, in order, a reply per rank (``batch``:
    all of them in one ("batch", replies) message at the end); stops after the first rank that does
    not complete, as the in-process loop would. One message per path, and the scenario itself once
    per scenario (``load``): the parent is not woken in between."""
    have, s, allocs = loaded
    if have != token:  # cannot happen while the parent sends "load" first; a reply names it if it does
        conn.send(("raised", "RuntimeError", f"kernel worker holds scenario {have}, asked for {token}", "*"))
        return
    replies = []
    stage = prep.for_ranks(s, {r: allocs[r] for r in ranks}, device, builtin=record is None, defer=batch)
    for rank, kn in zip(ranks, knobs):
        reply = _run(kernels, path, s, allocs[rank], rank, device, kn, record, packed=not batch,
                     inputs=stage.for_rank(rank))
        if batch:
            replies.append(reply)
        else:
            conn.send(reply)
        if reply[0] != "ok":
            break
    if batch:
        try:
            stage.settle()  # every rank's outputs at once; a device fault of any of them surfaces here
        except Exception as e:  # noqa: BLE001  (the parent runs the ranks again one by one to name the rank)
            conn.send(("lost", type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
            return
    if batch:
        conn.send(("batch", [(r[0], pack(r[1]), *r[2:]) if r[0] == "ok" else r for r in replies]))



def _prepare(device: str, threads: int | None = None) -> tuple:
    """``threads``: the parent's intra-op thread count (fuzz uses 1: its tensors are tiny, and a
    worker with one thread per core spends more time waking threads than computing)."""
    if threads:
        torch.set_num_threads(threads)
    try:
        if torch.device(device).type == "cpu":
            from cpsim.paths._inputs import prepare_triton
            prepare_triton(torch.device(device))
    except ConfigError as e:
        return ("config", e.field, e.rule)
    except Exception as e:  # noqa: BLE001  (reported to the parent, which names it)
        return ("raised", type(e).__name__, str(e), "*")
    return ("ok",)


def _run(kernels: dict, path: str, s, allocs, rank: int, device: str, knobs, record: dict | None,
         packed: bool = True, inputs: prep.PerRank | None = None) -> tuple:
    """One rank run's reply; ``packed``: its output as plain data (else the ``RankOutput`` itself).
    ``inputs``: the run's preparation (a stage's, for a chunk of ranks); else one made for it alone."""
    from cpsim.kernels.under_test import KernelImportError
    try:
        k = _kernel(kernels, path, record, device)
    except ConfigError as e:
        return ("config", e.field, e.rule)
    except KernelImportError as e:
        return ("unloaded", e.failure.kind, e.failure.message)
    failed = None if k is None else k.load_failure
    if failed is not None:
        return ("unloaded", failed.kind, failed.message)
    inputs = inputs if inputs is not None else prep.PerRank(s, device)
    try:
        out = run_path(path, s, allocs, rank, device, knobs, k, inputs)
    except ConfigError as e:
        return ("config", e.field, e.rule)
    except SystemExit as e:
        return ("exit", repr(e.code), inputs.launching)
    except BaseException as e:  # noqa: BLE001  (KeyboardInterrupt, GeneratorExit too: the kernel's, named)
        from cpsim.kernels.under_test import where_raised
        text = (str(e).splitlines()[0] if str(e) else "") + where_raised(k, e)
        return ("raised", type(e).__name__, text, inputs.launching)
    return ("ok", pack(out) if packed else out, list(k.notes) if k is not None else [])


def _call(kernels: dict, fn, path: str, record: dict, device: str, args: tuple) -> tuple:
    """``fn(kernel, *args)`` with the user's kernel loaded here (``cpsim.run.isolation.call``): its
    result, plain data the parent unpickles without running anything of the kernel's."""
    from cpsim.kernels.under_test import KernelImportError, where_raised
    try:
        k = _kernel(kernels, path, record, device)
    except ConfigError as e:
        return ("config", e.field, e.rule)
    except KernelImportError as e:
        return ("unloaded", e.failure.kind, e.failure.message)
    if k.load_failure is not None:
        return ("unloaded", k.load_failure.kind, k.load_failure.message)
    try:
        value = fn(k, *args)
    except ConfigError as e:
        return ("config", e.field, e.rule)
    except SystemExit as e:
        return ("exit", repr(e.code), "*")
    except BaseException as e:  # noqa: BLE001  (the kernel's exception, KeyboardInterrupt too, becomes a violation)
        text = (str(e).splitlines()[0] if str(e) else "") + where_raised(k, e)
        return ("raised", type(e).__name__, text, "*")
    return ("value", value, list(k.notes))

"""The child side of kernel isolation: a loop that runs whole rank runs of a path.

It imports no Triton at module level (a worker started ahead imports this module before it knows its
device; Triton must see ``TRITON_INTERPRET=1`` first, which ``prepare_triton`` sets for CPU devices). Every reply is one of ``cpsim.run.wire``'s messages, sent as plain data (a JSON
header and raw array bytes, never pickle: the parent judges what comes back and must not run
anything of the kernel's); anything the kernel does that ends the process shows up on the
parent's side as a closed pipe and an exit status instead.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from cpsim.errors import ConfigError
from cpsim.paths import RankOutput, prep, run_path
from cpsim.run import reaper, requests, wire
from cpsim.run.outcome import first_line, kernel_error


def pack(out: RankOutput | None) -> wire.RankOutputData | None:
    """A RankOutput as arrays and lists (what ``wire`` sends)."""
    if out is None:
        return None
    return wire.RankOutputData(
        out.slots.detach().cpu().numpy().astype(np.int64, copy=False), [bool(e) for e in out.enabled],
        [int(w) for w in out.widths], [int(e) for e in out.entry_sizes],
        None if out.guard is None else out.guard.cpu().numpy().astype(np.int64, copy=False),
        None if out.written is None else out.written.numpy().astype(np.int64, copy=False),
        None if out.output_faults is None else [int(f) for f in out.output_faults])


def unpack(data: wire.RankOutputData | None) -> RankOutput | None:
    """The parent's ``RankOutput`` of a validated reply (views of the frame's bytes where they are writable)."""
    if data is None:
        return None
    return RankOutput(_tensor(data.slots), list(data.enabled), list(data.widths), list(data.entry_sizes),
                      None if data.guard is None else _tensor(data.guard),
                      None if data.written is None else _tensor(data.written),
                      None if data.output_faults is None else list(data.output_faults))


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def _kernel(cache: dict, path: str, record: dict | None, device: str):
    if record is None:
        return None
    key = (path, repr(sorted(record.items())), device)
    if key not in cache:
        from cpsim.kernels.under_test import inspect_here, load_record
        cache[key] = load_record(record, path, device, where=f"kernel for {path}", inspect=inspect_here)
    return cache[key]


def main(fd: int, parent_pid: int, authkey: str) -> None:
    """The worker process's entry (``cpsim.run.worker.Worker.spawn``): serve the parent over the
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


def _probe(spec: str, path: str, shim_vllm: bool, device: str, where: str):
    """Import SPEC here and send back its signature as plain data (the parent never imports it)."""
    from cpsim.kernels.under_test import KernelImportError, inspect_here
    try:
        sig = inspect_here(spec, path, shim_vllm, device, where)
    except ConfigError as e:
        return wire.Refused(e.field, e.rule)
    except KernelImportError as e:
        return wire.Unloaded(e.failure.kind, e.failure.message)
    except BaseException as e:  # noqa: BLE001  (reading the kernel's signature raised: its failure, named)
        return wire.Unloaded("raised", f"raised {type(e).__name__} while its signature was read: {first_line(e)}")
    return wire.SignatureRead(sig.name, sig.triton, sig.is_callable, [(n, bool(d)) for n, d in sig.params],
                              sig.origin, sig.release)


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


def _send(conn, msg) -> None:
    conn.send_bytes(wire.encode(msg))


def serve(conn, parent_pid: int | None = None) -> None:
    """Answer requests until the parent closes the pipe (or dies)."""
    if parent_pid is not None:
        _die_with(parent_pid)
    kernels: dict = {}
    loaded = requests.Load(None, None, {})  # the scenario in hand
    while True:
        try:
            msg = conn.recv()  # the parent's request: pickled by the parent, which this process trusts
            _answer(conn, kernels, msg, loaded)
        except (EOFError, OSError):  # the parent is gone (or closed the pipe): nothing to answer to
            return
        if isinstance(msg, requests.Load):
            loaded = msg


def _answer(conn, kernels: dict, msg, loaded: requests.Load) -> None:
    if isinstance(msg, requests.Prepare):
        _send(conn, _prepare(msg.device, msg.threads))
    elif isinstance(msg, requests.Probe):
        _send(conn, _probe(msg.spec, msg.path, msg.shim_vllm, msg.device, msg.where))
    elif isinstance(msg, requests.RunRank):
        _send(conn, _run(kernels, msg.path, msg.s, msg.allocs, msg.rank, msg.device, msg.knobs, msg.record))
    elif isinstance(msg, requests.Call):
        _send(conn, _call(kernels, msg.fn, msg.path, msg.record, msg.device, msg.args))
    elif isinstance(msg, requests.RunRanks):
        _run_ranks(conn, kernels, loaded, msg)


def _run_ranks(conn, kernels: dict, loaded: requests.Load, ask: requests.RunRanks) -> None:
    """Every listed rank of one path of the loaded scenario, in order, a reply per rank (``batch``:
    all of them in one ``Batch`` message at the end); stops after the first rank that does not
    complete, as the in-process loop would. One message per path, and the scenario itself once
    per scenario (``Load``): the parent is not woken in between."""
    have, s, allocs = loaded.token, loaded.s, loaded.allocs
    path, token, ranks, device, knobs, record, batch = (ask.path, ask.token, ask.ranks, ask.device, ask.knobs,
                                                        ask.record, ask.batch)
    if have != token:  # cannot happen while the parent sends a Load first; a reply names it if it does
        _send(conn, wire.Raised("RuntimeError", f"kernel worker holds scenario {have}, asked for {token}"))
        return
    replies = []
    stage = prep.for_ranks(s, {r: allocs[r] for r in ranks}, device, builtin=record is None, defer=batch)
    for rank, kn in zip(ranks, knobs):
        reply = _run(kernels, path, s, allocs[rank], rank, device, kn, record, packed=not batch,
                     inputs=stage.for_rank(rank))
        if batch:
            replies.append(reply)
        else:
            _send(conn, reply)
        if not isinstance(reply, wire.RankDone):
            break
    if batch:
        try:
            stage.settle()  # every rank's outputs at once; a device fault of any of them surfaces here
        except Exception as e:  # noqa: BLE001  (the parent runs the ranks again one by one to name the rank)
            _send(conn, wire.LostOnReadback(type(e).__name__, first_line(e)))
            return
        _send(conn, wire.Batch([wire.RankDone(r.path, r.rank, pack(r.output), r.notes)
                                if isinstance(r, wire.RankDone) else r for r in replies]))


def _prepare(device: str, threads: int | None = None):
    """``threads``: the parent's intra-op thread count (fuzz uses 1: its tensors are tiny, and a
    worker with one thread per core spends more time waking threads than computing)."""
    if threads:
        torch.set_num_threads(threads)
    try:
        if torch.device(device).type == "cpu":
            from cpsim.paths._inputs import prepare_triton
            prepare_triton(torch.device(device))
    except ConfigError as e:
        return wire.Refused(e.field, e.rule)
    except Exception as e:  # noqa: BLE001  (reported to the parent, which names it)
        return wire.Raised(type(e).__name__, first_line(e))
    return wire.Ready()


def _run(kernels: dict, path: str, s, allocs, rank: int, device: str, knobs, record: dict | None,
         packed: bool = True, inputs: prep.PerRank | None = None):
    """One rank run's reply; ``packed``: its output as plain data (else the ``RankOutput`` itself, packed
    once the batch has settled). ``inputs``: the run's preparation (a stage's, for a chunk of ranks);
    else one made for it alone."""
    from cpsim.kernels.under_test import KernelImportError
    try:
        k = _kernel(kernels, path, record, device)
    except ConfigError as e:
        return wire.Refused(e.field, e.rule)
    except KernelImportError as e:
        return wire.Unloaded(e.failure.kind, e.failure.message)
    failed = None if k is None else k.load_failure
    if failed is not None:
        return wire.Unloaded(failed.kind, failed.message)
    inputs = inputs if inputs is not None else prep.PerRank(s, device)
    try:
        out = run_path(path, s, allocs, rank, device, knobs, k, inputs)
    except BaseException as e:  # noqa: BLE001  (KeyboardInterrupt, GeneratorExit too: the kernel's, named)
        return kernel_error(e, k, inputs.launching)
    return wire.RankDone(path, rank, pack(out) if packed else out, list(k.notes) if k is not None else [])


def _call(kernels: dict, fn, path: str, record: dict, device: str, args: tuple):
    """``fn(kernel, *args)`` with the user's kernel loaded here (``KernelRunner.call``): its
    result, integer arrays (one, or a tuple of them) sent as plain data."""
    from cpsim.kernels.under_test import KernelImportError
    try:
        k = _kernel(kernels, path, record, device)
    except ConfigError as e:
        return wire.Refused(e.field, e.rule)
    except KernelImportError as e:
        return wire.Unloaded(e.failure.kind, e.failure.message)
    if k.load_failure is not None:
        return wire.Unloaded(k.load_failure.kind, k.load_failure.message)
    try:
        value = fn(k, *args)
        arrays = [np.asarray(v) for v in value] if isinstance(value, tuple) else [np.asarray(value)]
    except BaseException as e:  # noqa: BLE001  (the kernel's exception, KeyboardInterrupt too, becomes a violation)
        return kernel_error(e, k)
    return wire.Value(arrays, isinstance(value, tuple), list(k.notes))

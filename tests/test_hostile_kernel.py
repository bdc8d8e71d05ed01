"""The hostile user's table (issue 27): one row per thing a user's kernel file or a fault does.

Every row writes its own tiny kernel into ``tmp_path``, runs ``cpsim`` as a user would (a
subprocess, ``python -m cpsim``), and asserts the exit code, that no traceback is printed, the
key phrase, the files written and that no process is left behind: every process cpsim starts
inherits a marker in its environment, and none may hold it once cpsim has exited.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from test_coordinator import world  # noqa: F401  (a fixture)
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm


def sigint_default() -> None:
    """In the child before exec: SIGINT back to its default. A test run started in the background
    (``nohup ... &``) inherits SIGINT ignored, and cpsim, like any program, keeps an ignored SIGINT
    ignored, so the rows that send one would test the launching shell instead of cpsim."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["run", "--scenario", "mtp", "--dcp", "2", "--paths", "v1"]

# A correct callable (tests/kernels/callable_abi.py, the slot rule written out in torch); rows wrap it to
# misbehave around it. Each row's module is written out whole, so it carries that source as text.
CORRECT = ((ROOT / "tests" / "kernels" / "callable_abi.py").read_text() + "\n\nslots = slot_mapping\n"
           "ARGS = ('positions, req_indices, idx_mapping, block_table, block_size, kv_block_size, '\n"
           "        'cp_world_size, cp_rank, cp_interleave, is_circular, pad_id')\n")


def callable_kernel(body: str, top: str = "") -> str:
    """A module with ``kernel`` in the callable ABI: ``body`` runs with ``out`` = the correct slots."""
    return (CORRECT + textwrap.dedent(top) + "\n\ndef kernel(positions, req_indices, idx_mapping, block_table, "
            "block_size, kv_block_size, cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):\n"
            "    out = slots(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,\n"
            "                cp_world_size, cp_rank, cp_interleave, is_circular, pad_id)\n"
            + textwrap.indent(textwrap.dedent(body), "    ") + "\n")


def forks(name: str) -> str:
    """A module whose ``kernel`` is tests/kernels/forks_setsid.py's ``name`` (it forks a setsid sleeper)."""
    return (f"import sys\nsys.path.insert(0, {str(ROOT / 'tests' / 'kernels')!r})\n"
            f"from forks_setsid import {name} as kernel  # noqa: E402,F401\n")


# A Triton kernel in the ascend-v1 ABI that computes right slots, then stores into the table row it read.
TRITON_STORES_INTO_TABLE = '''
import triton
import triton.language as tl


@triton.jit
def kernel(num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr, block_table_ptr,
           block_table_stride, block_size, slot_mapping_ptr, KV_CACHE_BLOCK_SIZE: tl.constexpr,
           BLOCKS_PER_KV_BLOCK: tl.constexpr, TOTAL_CP_WORLD_SIZE: tl.constexpr, TOTAL_CP_RANK: tl.constexpr,
           CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr, PAD_ID: tl.constexpr, TILE_BLOCK_SIZE: tl.constexpr,
           BLOCK_TABLE_WINDOW_SIZE: tl.constexpr):
    req = tl.program_id(0)
    if req == tl.num_programs(0) - 1:
        pad_from = tl.load(query_start_loc_ptr + req)
        for i in range(pad_from, max_num_tokens, TILE_BLOCK_SIZE):
            offs = i + tl.arange(0, TILE_BLOCK_SIZE)
            tl.store(slot_mapping_ptr + offs, tl.full((TILE_BLOCK_SIZE,), PAD_ID, tl.int32),
                     mask=offs < max_num_tokens)
        return
    start = tl.load(query_start_loc_ptr + req)
    end = tl.load(query_start_loc_ptr + req + 1)
    row = block_table_ptr + req.to(tl.int64) * block_table_stride
    for i in range(start, end, TILE_BLOCK_SIZE):
        offs = i + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offs < end
        pos = tl.load(positions_ptr + offs, mask=mask, other=0).to(tl.int64)
        span = KV_CACHE_BLOCK_SIZE * TOTAL_CP_WORLD_SIZE
        vo = pos % span
        mine = (vo // CP_KV_CACHE_INTERLEAVE_SIZE) % TOTAL_CP_WORLD_SIZE == TOTAL_CP_RANK
        local = (vo // (TOTAL_CP_WORLD_SIZE * CP_KV_CACHE_INTERLEAVE_SIZE)) * CP_KV_CACHE_INTERLEAVE_SIZE \\
            + vo % CP_KV_CACHE_INTERLEAVE_SIZE
        idx = (pos // span) * BLOCKS_PER_KV_BLOCK + local // block_size
        ok = mask & mine & (idx < block_table_stride)
        blk = tl.load(row + idx, mask=ok, other=0).to(tl.int64)
        tl.store(slot_mapping_ptr + offs, tl.where(ok, blk * block_size + local % block_size, PAD_ID).to(tl.int32),
                 mask=mask)
        tl.store(row + idx, (blk * 0).to(tl.int32), mask=ok)  # the hostile part: the table it read
'''


@dataclass
class Row:
    """One line of the issue's table: what the kernel does, and what cpsim must answer."""

    name: str
    source: str                      # the kernel file's text
    attr: str = "kernel"
    args: list[str] = field(default_factory=list)
    code: int = 1
    phrases: tuple[str, ...] = ()    # each must appear in the output or the JSON (whitespace collapsed)
    absent: tuple[str, ...] = ()     # must not appear
    json: bool = True                # --json written, with passed False
    during: object = None            # callable(proc, tmp_path) run while cpsim runs (kills, signals)


ROWS = [
    Row("import replaces the oracle's check and passed", CORRECT + textwrap.dedent('''
        import cpsim.check.coordinator as c
        c.check = lambda *a, **k: []
        c.passed = lambda verdicts: True


        def kernel(positions, block_table):
            return torch.zeros_like(positions)
        '''), phrases=("matches-reference", "invariants violated")),
    Row("os._exit(0) at import", "import os\nos._exit(0)\n\n\ndef kernel(positions):\n    return positions\n",
        phrases=("kernel ended its process with exit code 0", "while file", "was imported")),
    Row("hang at import, --kernel-timeout 8", "import time\ntime.sleep(1000)\n\n\ndef kernel(positions):\n"
        "    return positions\n", args=["--kernel-timeout", "8"],
        phrases=("did not finish importing file", "within 8 s (worker killed)")),
    Row("callable zeroes block_table in place, right slots", callable_kernel("block_table.zero_()\nreturn out"),
        phrases=("inputs-intact", "kernel wrote 146 entries of group attn's block table on rank 0")),
    Row("Triton kernel stores into the table rows it read", TRITON_STORES_INTO_TABLE,
        phrases=("inputs-intact", "of group attn's block table on rank 0")),
    Row("callable returns complex64 slots", callable_kernel("return out.to(torch.complex64)"),
        phrases=("kernel-output", "is complex for group attn on rank 0")),
    Row("callable returns None, 2-D, float or a list on one rank each", callable_kernel(
        "return [None, out[None], out.double(), out.tolist()][cp_rank]"), args=["--dcp", "4"],
        phrases=("is not a tensor for group attn on rank 0", "is not 1-D for group attn on rank 1",
                 "is floating-point for group attn on rank 2", "is not a tensor for group attn on rank 3")),
    Row("callable forks a child that sleeps", callable_kernel('''
        import os, time
        if os.fork() == 0:
            open(os.environ["CPSIM_TEST_PIDS"], "a").write(f"{os.getpid()}\\n")
            time.sleep(300)
            os._exit(0)
        return out'''), code=0, phrases=("all invariants hold",), json=False),
    # A daemon, the classic way: its own session (out of the worker's process group), then orphaned.
    Row("callable forks a child that calls setsid and leaves a daemon", callable_kernel('''
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                open(os.environ["CPSIM_TEST_PIDS"], "a").write(f"{os.getpid()}\\n")
                time.sleep(300)
            os._exit(0)
        return out'''), code=0, phrases=("all invariants hold",), json=False),
    # A setsid child the kernel leaves when its worker is killed: on a timeout by cpsim (which ends the
    # worker's whole tree), or by the kernel itself (the child still holds the worker's pipe open: the
    # worker's end is seen at once all the same, through its pidfd).
    Row("callable forks a setsid child, then hangs, --kernel-timeout 5", forks("then_hangs"),
        args=["--kernel-timeout", "5"], phrases=("kernel exceeded 5 s (worker killed) on rank 0",)),
    # (a parent that waited for the pipe alone would report a timeout: the bound is well below the child's sleep)
    Row("callable forks a setsid child, then SIGKILLs its worker", forks("then_kills_worker"),
        args=["--kernel-timeout", "60"], phrases=("kernel crashed with SIGKILL on rank 0",)),
]


# Exceptions a kernel raises that are not Exceptions: each is the kernel's failure on its rank, with
# no worker traceback printed; an ordinary one names the kernel's own frames only (issue 27, item 6).
ROWS += [
    Row("callable raises KeyboardInterrupt", callable_kernel("raise KeyboardInterrupt('stop')"),
        phrases=("kernel raised KeyboardInterrupt: stop at", "on rank 0, group attn"), absent=("SIGINT",)),
    Row("callable raises GeneratorExit", callable_kernel("raise GeneratorExit()"),
        phrases=("kernel raised GeneratorExit at", "on rank 0, group attn")),
    Row("callable raises SystemExit(0)", callable_kernel("raise SystemExit(0)"),
        phrases=("kernel called sys.exit(0) on rank 0",)),
    Row("KeyboardInterrupt at import", "raise KeyboardInterrupt\n\n\ndef kernel(positions):\n    return positions\n",
        phrases=("kernel raised KeyboardInterrupt while its file",)),
    Row("an exception two frames deep names the kernel's frames only", callable_kernel(
        "return helper(out)", top="\n\ndef helper(x):\n    raise ValueError('deep')\n"),
        phrases=("kernel raised ValueError: deep at", "raise ValueError('deep'); called from hostile_kernel.py:",
                 " in kernel on rank 0"), absent=("adapters.py", "kernel_worker.py")),
]


def _killed_mid_run(proc, tmp_path: Path) -> None:
    """SIGKILL the kernel worker from outside once the kernel is running (it wrote its pid)."""
    pids = tmp_path / "pids"
    end = time.monotonic() + 120
    while time.monotonic() < end and not (pids.exists() and pids.read_text().strip()):
        time.sleep(0.1)
    os.kill(int(pids.read_text().split()[0]), signal.SIGKILL)


ROWS.append(Row("SIGKILL of the kernel worker mid-run", callable_kernel('''
        import os, time
        open(os.environ["CPSIM_TEST_PIDS"], "a").write(f"{os.getpid()}\\n")
        time.sleep(60)
        return out'''), phrases=("kernel crashed with SIGKILL on rank 0",), during=_killed_mid_run))


def _signal_when_running(signum: int, group: bool):
    """Send ``signum`` to cpsim (``group``: its whole process group, as a terminal's Ctrl-C does)
    once the kernel is running (it wrote its pid)."""
    def during(proc, tmp_path: Path) -> None:
        pids = tmp_path / "pids"
        end = time.monotonic() + 120
        while time.monotonic() < end and not (pids.exists() and pids.read_text().strip()):
            time.sleep(0.1)
        (os.killpg if group else os.kill)(proc.pid, signum)
    return during


SLEEPS = callable_kernel('''
    import os, time
    open(os.environ["CPSIM_TEST_PIDS"], "a").write(f"{os.getpid()}\\n")
    time.sleep(60)
    return out''')
ROWS += [
    Row("the kernel sends SIGINT to cpsim's main process", callable_kernel('''
        import os, signal
        os.kill(os.getppid(), signal.SIGINT)
        return out'''), code=130, phrases=("interrupted: SIGINT", '"interrupted": "SIGINT"')),
    # The worker's own group is not told apart from a user's kill (Python gives no sender): the run ends
    # interrupted, exit 143, and the --json says so; never a pass.
    Row("the kernel sends SIGTERM to cpsim's main process", callable_kernel('''
        import os, signal
        os.kill(os.getppid(), signal.SIGTERM)
        return out'''), code=143, phrases=("interrupted: SIGTERM", '"interrupted": "SIGTERM"')),
    Row("Ctrl-C during run", SLEEPS, code=130, phrases=("interrupted: SIGINT",),
        during=_signal_when_running(signal.SIGINT, group=True)),
    Row("SIGTERM during run", SLEEPS, code=143, phrases=("interrupted: SIGTERM",),
        during=_signal_when_running(signal.SIGTERM, group=False)),
]


def _marked(mark: str) -> list[int]:
    """Live processes whose environment holds ``mark``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark.encode() in env and state != "Z":
            out.append(int(d.name))
    return out


def cpsim(tmp_path: Path, args: list[str], during=None, timeout: float = 300) -> tuple[int, str]:
    """Run ``python -m cpsim args`` in ``tmp_path``; (exit code, stdout + stderr). Asserts that no process
    it started is alive afterwards."""
    mark = f"cpsim-hostile-{uuid.uuid4().hex}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), CPSIM_TEST_MARK=mark, CPSIM_TEST_PIDS=str(tmp_path / "pids"),
               COLUMNS="200", CPSIM_KERNEL_WORKERS="1")
    proc = subprocess.Popen([sys.executable, "-m", "cpsim", *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=sigint_default)
    if during is not None:
        during(proc, tmp_path)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    end = time.monotonic() + 10
    while _marked(mark) and time.monotonic() < end:  # the group kill is asynchronous
        time.sleep(0.1)
    left = _marked(mark)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"
    return proc.returncode, out


FORKING = ["callable forks a child that sleeps", "callable forks a child that calls setsid and leaves a daemon",
           "callable forks a setsid child, then hangs, --kernel-timeout 5",
           "callable forks a setsid child, then SIGKILLs its worker"]


@dataclass
class RowRun:
    """What one ``cpsim`` run of a row left: exit code, output, the JSON report's text (None: not written),
    and the pids its kernel's forked children wrote, with those still alive right after cpsim exited."""

    code: int
    out: str
    report: str | None
    pids: list[int]
    alive: list[int]


_ROW_RUNS: dict[str, RowRun] = {}  # the forking rows' runs: two tests read each


def _row_run(tmp_path: Path, row: Row) -> RowRun:
    if row.name in _ROW_RUNS:
        return _ROW_RUNS[row.name]
    kernel = tmp_path / "hostile_kernel.py"
    kernel.write_text(row.source)
    report = tmp_path / "r.json"
    args = [*SMALL, "--kernel-v1", f"{kernel}:{row.attr}", *row.args] + (["--json", str(report)] if row.json else [])
    code, out = cpsim(tmp_path, args, row.during)
    pids_file = tmp_path / "pids"
    pids = [int(line.split()[-1]) for line in pids_file.read_text().splitlines()] if pids_file.exists() else []
    run = RowRun(code, out, report.read_text() if report.exists() else None, pids, [p for p in pids if _alive(p)])
    if row.name in FORKING:
        _ROW_RUNS[row.name] = run
    return run


def _alive(pid: int) -> bool:
    """A live process (not a zombie) has this pid."""
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    except OSError:  # gone
        return False


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_hostile_kernel_row(tmp_path, row):
    run = _row_run(tmp_path, row)
    code, out = run.code, run.out
    text = " ".join(out.split())
    assert "Traceback" not in out, out
    assert code == row.code, out
    if row.json:
        assert run.report is not None, out
        data = json.loads(run.report)
        assert data["passed"] is (row.code == 0)
        text += " " + " ".join(json.dumps(data).split())
    for phrase in row.phrases:
        assert phrase in text, (phrase, out)
    for phrase in row.absent:
        assert phrase not in text, (phrase, out)


@pytest.mark.parametrize("row", FORKING)
def test_a_forked_child_of_the_kernel_does_not_outlive_cpsim(tmp_path, row):
    """The forking rows' run (one for this test and the row's, whichever comes first), read by the
    children's pids: each was gone once cpsim had exited."""
    r = ROWS[[r.name for r in ROWS].index(row)]
    run = _row_run(tmp_path, r)
    assert run.code == r.code, run.out
    assert run.pids
    assert run.alive == [], run.pids


# ---- the same deeds in-process (cpsim.cli.main), and the oracle fed broken data directly ----------

def _main(capsys, tmp_path, source: str, *extra: str) -> tuple[int, str, dict]:
    from cpsim import cli
    kernel = tmp_path / "k.py"
    kernel.write_text(source)
    report = tmp_path / "r.json"
    code = cli.main([*SMALL, "--kernel-v1", f"{kernel}:kernel", "--json", str(report), *extra], runner=RUNNER)
    cap = capsys.readouterr()
    assert "Traceback" not in cap.out + cap.err
    return code, " ".join((cap.out + cap.err).split()), json.loads(report.read_text())


@pytest.mark.parametrize("top, phrase", [
    ("raise RuntimeError('import boom')", "raised RuntimeError while its file"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "crashed with SIGKILL while file"),
])
def test_an_import_that_fails_is_a_named_violation(capsys, tmp_path, top, phrase):
    code, text, report = _main(capsys, tmp_path, f"{top}\n\n\ndef kernel(positions):\n    return positions\n")
    assert code == 1 and phrase in text and str(tmp_path / "k.py") in text
    [v] = [v for v in report["verdicts"] if v["invariant"] == "kernel-completes"]
    assert v["status"] == "fail" and phrase in v["violations"][0]["message"]


def test_a_kernel_writing_positions_is_named_and_later_ranks_see_them_intact(capsys, tmp_path):
    code, text, report = _main(capsys, tmp_path, callable_kernel("positions[:3] = -5\nreturn out"))
    assert code == 1
    assert "kernel wrote 3 entries of positions on rank 0" in text
    assert "kernel wrote 3 entries of positions on rank 1" in text  # restored after rank 0: the same 3
    fails = {v["invariant"] for v in report["verdicts"] if v["status"] == "fail"}
    assert fails == {"inputs-intact"}  # its slots were right: only the writes are wrong


def _with(world, path, **arrays):
    import copy
    g = copy.deepcopy(world[2])
    for name, value in arrays.items():
        setattr(g[path], name, value)
    return g


def test_inputs_intact_names_the_table_and_the_rank(world):  # noqa: F811
    import torch
    from cpsim.check import coordinator
    from cpsim.paths import _intact
    from test_coordinator import judge
    assert coordinator.INPUT_NAMES == _intact.INPUTS
    s = world[0]
    clean = torch.zeros((s.cp.world, len(s.groups), len(_intact.INPUTS)), dtype=torch.int64)
    fails, verdicts = judge(world, _with(world, "v1", written=clean))
    assert ("inputs-intact", "v1") not in fails
    assert {v.status for v in verdicts if v.invariant == "inputs-intact" and v.path == "v1"} == {"pass"}
    bad = clean.clone()
    bad[2, 0, _intact.INPUTS.index("block table")] = 37
    fails, verdicts = judge(world, _with(world, "v1", written=bad))
    assert fails == {("inputs-intact", "v1")}
    [v] = [v for v in verdicts if v.invariant == "inputs-intact" and v.path == "v1"]
    assert [x.message.split(" (")[0] for x in v.violations] == ["kernel wrote 37 entries of group attn's block "
                                                              "table on rank 2"]
    assert v.violations[0].ranks == [2]


def test_kernel_output_names_the_fault_and_the_rank(world):  # noqa: F811
    import torch
    from cpsim.check import coordinator
    from cpsim.paths import adapters
    from test_coordinator import judge
    assert coordinator.OUTPUT_FAULTS == adapters.OUTPUT_FAULTS
    s = world[0]
    ok = torch.zeros((s.cp.world, len(s.groups)), dtype=torch.int64)
    assert ("kernel-output", "v1") not in judge(world, _with(world, "v1", output_faults=ok))[0]
    bad = ok.clone()
    bad[1, 0] = adapters.OUTPUT_FAULTS.index("complex")
    fails, verdicts = judge(world, _with(world, "v1", output_faults=bad))
    assert fails == {("kernel-output", "v1")}
    [v] = [v for v in verdicts if v.invariant == "kernel-output" and v.path == "v1"]
    assert "is complex for group attn on rank 1" in v.violations[0].message


@pytest.mark.parametrize("result, fault", [
    (None, "not a tensor"), ([1, 2, 3], "not a tensor"), ("zeros2d", "not 1-D"), ("float", "floating-point"),
    ("complex", "complex"), ("bool", "bool"), ("short", "shorter than the scheduled tokens"),
    ("long", "longer than the slot buffer"), ("ok", ""), ("int32", ""),
])
def test_output_fault_codes(result, fault):
    import torch
    from cpsim.paths.adapters import OUTPUT_FAULTS, output_fault
    made = {"zeros2d": torch.zeros((2, 4), dtype=torch.int64), "float": torch.zeros(4), "complex":
            torch.zeros(4, dtype=torch.complex64), "bool": torch.zeros(4, dtype=torch.bool),
            "short": torch.zeros(3, dtype=torch.int64), "long": torch.zeros(9, dtype=torch.int64),
            "ok": torch.zeros(4, dtype=torch.int64), "int32": torch.zeros(8, dtype=torch.int32)}
    res = made.get(result, result) if isinstance(result, str) else result
    assert OUTPUT_FAULTS[output_fault(res, "cpu", 4, 8)] == fault


# ---- issue 30: no import trap; errors point at the kernel's line ---------------------------------

def _script(tmp_path: Path, body: str) -> tuple[int, str]:
    """``python script.py`` in ``tmp_path`` (cpsim found through sys.path, as an installed one is)."""
    script = tmp_path / "user_script.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n" + textwrap.dedent(body))
    mark = f"cpsim-hostile-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(CPSIM_TEST_MARK=mark, CPSIM_KERNEL_WORKERS="1", COLUMNS="200")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, text=True, timeout=300,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert not _marked(mark)
    return done.returncode, done.stdout


def test_a_cpsim_folder_in_the_current_directory_does_not_reach_the_workers(tmp_path):
    (tmp_path / "cpsim").mkdir()
    (tmp_path / "cpsim" / "__init__.py").write_text("raise ImportError('the wrong cpsim was imported')\n")
    code, out = _script(tmp_path, '''
        from cpsim.cli import main
        sys.exit(main(["run", "--scenario", "mtp", "--dcp", "2", "--paths", "v1"]))
        ''')
    assert code == 0 and "all invariants hold" in out and "wrong cpsim" not in out, out


def test_a_script_without_a_main_guard_checks_a_kernel_once(tmp_path):
    (tmp_path / "k.py").write_text(callable_kernel("return out"))
    code, out = _script(tmp_path, f'''
        from cpsim.plugin.testing import check_kernel
        check_kernel({str(tmp_path / "k.py") + ":kernel"!r}, scenarios=["mtp"])
        print("CHECKED")
        ''')
    assert code == 0 and out.count("CHECKED") == 1 and "Traceback" not in out, out


def test_an_interpreter_error_names_the_kernels_file_line_and_source(capsys, tmp_path):
    body = TRITON_STORES_INTO_TABLE.replace("    req = tl.program_id(0)\n", "    req = tl.program_id(0) + II\n")
    code, text, report = _main(capsys, tmp_path, body)
    line = body.splitlines().index("    req = tl.program_id(0) + II") + 1
    assert code == 1
    assert f"NameError(\"name 'II' is not defined\") at {tmp_path / 'k.py'}:{line}: req = tl.program_id(0) + II" \
        in text


@pytest.mark.parametrize("args, phrase", [
    (["run", "--paths", "v1,,v2"], "--paths: 'v1,,v2' has an empty entry"),
    (["sweep", "--cp", "2,,4"], "cp: '2,,4' has an empty entry"),
])
def test_an_empty_list_entry_is_bad_input(tmp_path, args, phrase):
    """Small holes: an empty entry in a comma list is exit 2 and one line, not silently dropped."""
    code, out = cpsim(tmp_path, args, timeout=120)
    assert code == 2, out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
    assert phrase in out, out


# ---- issue 27, item 1: replay of a capture or an explicit batch never imports the kernel here -----

# A Triton kernel in the ascend-v1 ABI (the ABIs a captured step is rerun with) that writes PAD
# everywhere: wrong slots on every rank, which a working oracle reports.
TRITON_ALL_PAD = '''
import triton
import triton.language as tl


@triton.jit
def kernel(num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr, block_table_ptr,
           block_table_stride, block_size, slot_mapping_ptr, KV_CACHE_BLOCK_SIZE: tl.constexpr,
           BLOCKS_PER_KV_BLOCK: tl.constexpr, TOTAL_CP_WORLD_SIZE: tl.constexpr, TOTAL_CP_RANK: tl.constexpr,
           CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr, PAD_ID: tl.constexpr, TILE_BLOCK_SIZE: tl.constexpr,
           BLOCK_TABLE_WINDOW_SIZE: tl.constexpr):
    for i in range(0, max_num_tokens, TILE_BLOCK_SIZE):
        offs = i + tl.arange(0, TILE_BLOCK_SIZE)
        tl.store(slot_mapping_ptr + offs, tl.full((TILE_BLOCK_SIZE,), PAD_ID, tl.int32), mask=offs < max_num_tokens)
'''
PATCHES_THE_ORACLE = '''
import cpsim.check.coordinator as c
c.check = lambda *a, **k: []
c.passed = lambda verdicts: True
''' + TRITON_ALL_PAD
EXITS_AT_IMPORT = "import os\nos._exit(0)\n" + TRITON_ALL_PAD


@pytest.fixture(scope="module")
def v1_capture(tmp_path_factory) -> Path:
    """Two steps of cpsim's own v1 kernel on both ranks of DCP 2, captured (one attention group)."""
    from cpsim.capture import simulate
    from cpsim.presets import preset
    d = tmp_path_factory.mktemp("cap") / "v1"
    simulate.run([preset("mtp", dcp=2), preset("mtp", dcp=2, seed=1)], d, paths=("v1",))
    return d


REPLAY_ROWS = [
    ("capture", PATCHES_THE_ORACLE, ("matches-reference", "rerun-v1")),
    ("explicit batch", PATCHES_THE_ORACLE, ("matches-reference",)),
    ("capture", EXITS_AT_IMPORT, ("kernel-completes", "kernel ended its process with exit code 0", "was imported")),
    ("explicit batch", EXITS_AT_IMPORT, ("kernel-completes", "kernel ended its process with exit code 0",
                                         "was imported")),
]


@pytest.mark.parametrize("target, source, phrases", REPLAY_ROWS,
                         ids=[f"{t}: {'patches the oracle' if s is PATCHES_THE_ORACLE else 'os._exit(0) at import'}"
                              for t, s, _ in REPLAY_ROWS])
def test_replay_never_imports_the_kernel_in_the_judging_process(tmp_path, v1_capture, target, source, phrases):
    """``cpsim replay`` reruns a capture's or an explicit batch's inputs through the user's kernel in a
    kernel worker: what its import does to cpsim there cannot reach the judge, nor end it with 0."""
    kernel = tmp_path / "hostile_kernel.py"
    kernel.write_text(source)
    what = v1_capture if target == "capture" else ROOT / "examples" / "explicit-shuffled-positions.json"
    report = tmp_path / "r.json"
    code, out = cpsim(tmp_path, ["replay", str(what), "--kernel-v1", f"{kernel}:kernel", "--json", str(report)])
    assert "Traceback" not in out, out
    assert code == 1, out
    data = json.loads(report.read_text())
    assert data["passed"] is False
    text = " ".join(out.split()) + " " + " ".join(json.dumps(data).split())
    for phrase in phrases:
        assert phrase in text, (phrase, out)
    if source is EXITS_AT_IMPORT:
        assert str(kernel) in text  # the file is named

"""Issue 35, items 2-4: the routes the probe re-run found open, one row per probe class.

Input rows (exit 2, one line naming the field and the rule, before anything is allocated or run)
run ``cpsim.cli.main`` in process, as tests/test_bad_input.py does; rows where a user's kernel or a
``--stack-python`` runs go through ``python -m cpsim`` (tests/test_hostile_kernel.py's ``cpsim``:
no process may be left behind) and check the exit code, that no traceback is printed and that the
requested ``--json`` is written.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from cpsim import bounds
from cpsim.cli import main
from test_bad_input import EXPLICIT, REPLAY, SCENARIO, Row, capture_file, explicit, json_file, run_row
from test_hostile_kernel import TRITON_STORES_INTO_TABLE, cpsim
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm


def forged_npz(shapes: dict[str, tuple[int, ...]], held: int = 64):
    """The shuffled-positions batch as a ``.npz`` whose members named in ``shapes`` hold a ``.npy``
    header declaring that shape (int64) and only ``held`` bytes of data."""
    def make(tmp: Path) -> Path:
        d = json.loads(EXPLICIT.read_text())
        arrays = d.pop("arrays")
        p = tmp / "forged.npz"
        with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as z:
            z.writestr("meta.json", json.dumps(d))
            for name, value in arrays.items():
                buf = io.BytesIO()
                if name in shapes:
                    header = {"descr": "<i8", "fortran_order": False, "shape": shapes[name]}
                    np.lib.format.write_array_header_2_0(buf, header)
                    buf.write(b"\0" * held)
                else:
                    np.lib.format.write_array(buf, np.asarray(value))
                z.writestr(name + ".npy", buf.getvalue())
        return p
    return make


def _huge_scenario(groups: int, max_num_reqs: int, max_model_len: int, batched: int = 2048) -> dict:
    return {"name": "huge", "cp": {"dcp": 2, "pcp": 1, "interleave": 1},
            "groups": [{"name": f"g{i}", "kind": "attention", "block_size": 16, "num_blocks": 64}
                       for i in range(groups)],
            "limits": {"max_model_len": max_model_len, "max_num_reqs": max_num_reqs,
                       "max_num_batched_tokens": batched},
            "batch": {"requests": [{"context_len": 0, "num_tokens": 16}]}}


def _narrow(d: dict) -> None:
    """Positions 8..15 (the second virtual block) with one-entry tables: every rank reads entry 1."""
    d["arrays"]["positions"] = [13, 10, 15, 8, 11, 14, 9, 12]
    d["arrays"]["r0/g0/table"], d["arrays"]["r1/g0/table"] = [[3]], [[2]]


ROWS = [
    # -- item 2: explicit batches validate every size field --
    Row("explicit-entry-size-0", REPLAY, "explicit.groups[0].entry_size: must be greater than or equal to 1, got 0",
        explicit(lambda d: d["groups"][0].__setitem__("entry_size", 0))),
    # -- item 4: sizes bounded before allocation --
    Row("npz-header-2^31-positions", REPLAY, "array 'positions' declares shape (2147483648,) = 2147483648 entries, "
        f"more than the limit of {bounds.MAX_ARRAY_ENTRIES}", forged_npz({"positions": (2**31,)})),
    Row("npz-header-2^40-positions", REPLAY, "array 'positions' declares shape (1099511627776,)",
        forged_npz({"positions": (2**40,)})),
    Row("npz-header-2^20-x-2^20-table", REPLAY, "array 'r0/g0/table' declares shape (1048576, 1048576)",
        forged_npz({"r0/g0/table": (2**20, 2**20)})),
    Row("npz-header-more-than-the-member-holds", REPLAY, "array 'positions' declares shape (1048576,) of int64: "
        "8388608 bytes of data, the member holds 64", forged_npz({"positions": (2**20,)})),
    Row("npz-arrays-together-past-the-batch-limit", REPLAY, "hold 201326598 entries together, more than the limit "
        f"of {bounds.MAX_BATCH_ENTRIES}", forged_npz({"r0/slots": (1, 2**26), "r1/slots": (1, 2**26),
                                                      "positions": (2**26,)})),
    Row("json-arrays-past-the-inline-limit", REPLAY, f"hold 1048603 entries together, more than the limit of "
        f"{bounds.MAX_JSON_ENTRIES}",
        explicit(lambda d: d["arrays"].__setitem__("positions", [0] * (bounds.MAX_JSON_ENTRIES + 1)))),
    Row("scenario-64-groups-x-65536-requests-x-2^24", SCENARIO, "limits.max_num_reqs: 64 group(s) x 65536 requests "
        "x their table widths for max_model_len 16777216", json_file(_huge_scenario(64, 65536, 2**24))),
    Row("scenario-slot-buffers-past-the-limit", SCENARIO, "limits.max_num_batched_tokens: 8 group(s) x a slot "
        "buffer of 16777216 entries", json_file(_huge_scenario(8, 1, 2**24, 2**24))),
    # -- item 4: a malformed batch is input, not a violation --
    Row("explicit-positions-beyond-max-model-len", REPLAY, "ranks[0].positions: position 20 of request 0 is not "
        "below limits.max_model_len 16", explicit(lambda d: d["arrays"].__setitem__("positions",
                                                                                      [5, 2, 7, 0, 3, 6, 1, 20]))),
    Row("explicit-table-too-narrow-for-positions", REPLAY, "ranks[0].g0(attn).table: width 1 is too narrow for "
        "position 10 of request 0: rank 0's kernel reads entry 1 of its row", explicit(_narrow)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_input_row(row: Row, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = run_row(row, tmp_path)
    code = main(argv, runner=RUNNER)
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert row.phrase in lines[0], lines[0]


def test_a_batch_that_records_a_real_run_is_judged_and_says_why(tmp_path, capsys):
    """The same narrow table in a batch naming the kernels whose outputs it holds (``label.kernels``,
    as a capture's steps and their shrunk batches do): the run's finding, exit 1, with a note."""
    f = explicit(lambda d: (_narrow(d), d["label"].__setitem__("kernels", ["host.py:slot_kernel"])))(tmp_path)
    assert main(["replay", str(f)], runner=RUNNER) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "first violation: dense-local" in out
    assert "judged, not refused: the step records a real run of host.py:slot_kernel" in out


def test_good_batches_and_scenarios_stay_inside_the_limits(tmp_path, capsys):
    """The limits refuse nothing real: the example batch (JSON and .npz) replays clean."""
    from test_bad_input import explicit_npz
    for i, make in enumerate((explicit(lambda d: None), explicit_npz())):
        d = tmp_path / str(i)
        d.mkdir()
        assert main(["replay", str(make(d)), "--quiet"], runner=RUNNER) == 0, capsys.readouterr()


# ---- item 2: inputs-intact on the replay routes ----------------------------------------------

@pytest.mark.parametrize("what", ["explicit batch", "capture"])
def test_replay_with_a_kernel_that_overwrites_its_table_is_inputs_intact(tmp_path, what):
    kernel = tmp_path / "stores.py"
    kernel.write_text(TRITON_STORES_INTO_TABLE)
    target = EXPLICIT if what == "explicit batch" else capture_file()(tmp_path)
    code, out = cpsim(tmp_path, ["replay", str(target), "--kernel-v1", f"{kernel}:kernel", "--json",
                                 str(tmp_path / "r.json")])
    assert "Traceback" not in out, out
    assert code == 1, out
    text = " ".join(out.split())
    assert "first violation: inputs-intact [rerun-v1]" in text, out
    assert "of group" in text and "block table on rank 0" in text, out
    assert json.loads((tmp_path / "r.json").read_text())["passed"] is False


# ---- item 3: the stack driver bounded, refused or judged ------------------------------------

def _stack_python(tmp_path: Path, kind: str) -> str:
    if kind == "directory":
        (tmp_path / "venv").mkdir()
        return str(tmp_path / "venv")
    scripts = {"not executable": "#!/bin/sh\nexit 0\n", "no #! line": "echo hi\n",
               "hangs": "#!/bin/sh\nsleep 1000\n", "prints a fake pass, exit 0": "#!/bin/sh\necho pass\nexit 0\n"}
    p = tmp_path / "python"
    p.write_text(scripts[kind])
    p.chmod(0o644 if kind == "not executable" else 0o755)
    return str(p)


@pytest.mark.parametrize("kind, phrase", [
    ("directory", "--stack-python: {py} is a directory"),
    ("not executable", "--stack-python: {py} is not executable"),
    ("no #! line", "--stack-python: {py} cannot be run (Exec format error)"),
])
def test_a_stack_python_that_is_not_a_program_is_exit_2(tmp_path, capsys, kind, phrase):
    py = _stack_python(tmp_path, kind)
    code = main(["run", "--stack", "vllm", "--dcp", "2", "--stack-python", py, "--json", str(tmp_path / "r.json")], runner=RUNNER)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    assert len(err.strip().splitlines()) == 1 and phrase.format(py=py) in err, err


@pytest.mark.parametrize("kind, phrase", [
    ("hangs", "the stack driver (vllm) ran past 5 s and was killed"),  # a shell's sleep: 5 s is ample
    ("prints a fake pass, exit 0", "the stack driver (vllm) exited 0: pass"),
])
@pytest.mark.slow
def test_a_stack_python_that_hangs_or_lies_fails_and_keeps_every_report(tmp_path, kind, phrase):
    py = _stack_python(tmp_path, kind)
    start = time.monotonic()
    code, out = cpsim(tmp_path, ["run", "--stack", "vllm", "--dcp", "2", "--stack-python", py, "--timeout", "5",
                                 "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"),
                                 "--html", str(tmp_path / "r.html")], timeout=120)
    assert time.monotonic() - start < 90, "bounded by --timeout 5"
    assert "Traceback" not in out, out
    assert code == 1, out
    assert phrase in " ".join(out.split()), out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["passed"] is False
    assert phrase in json.dumps(data)
    assert phrase in (tmp_path / "r.xml").read_text() and phrase in (tmp_path / "r.html").read_text()


# ---- item 3: fuzz SIGTERMed by its kernel ---------------------------------------------------

SIGTERMS_FUZZ = '''
import os, signal, sys
sys.path.insert(0, {kernels!r})
from callable_abi import slot_mapping as _correct


def slot_mapping(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                 cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    """SIGTERM cpsim's fuzz: the topmost ancestor running ``-m cpsim fuzz`` (the worker's parent is a fuzz
    job, or the fuzz itself once a finished job's worker is re-parented to it); say whom, for the test."""
    pid, fuzz = os.getppid(), None
    while pid > 1:
        with open(f"/proc/{{pid}}/cmdline", "rb") as f:
            argv = f.read().split(bytes(1))
        if [b"-m", b"cpsim", b"fuzz"] in [argv[k:k + 3] for k in range(len(argv))]:
            fuzz = pid
        with open(f"/proc/{{pid}}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    with open({killed!r}, "a") as f:
        f.write(f"{{os.getpid()}} -> {{fuzz}}" + chr(10))
    if fuzz is not None:
        os.kill(fuzz, signal.SIGTERM)
    return _correct(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                    cp_world_size, cp_rank, cp_interleave, is_circular, pad_id)
'''


def test_fuzz_sigtermed_by_its_kernel_writes_the_summary_without_a_traceback(tmp_path):
    """The kernel SIGTERMs cpsim's fuzz from a job's worker: fuzz stops its jobs and writes the summary;
    the job's workers end before the job unwinds (none prints a BrokenPipeError), nothing is left.
    (On b969b18 the traceback is a race: a worker of the other job still loading the kernel when its
    job leaves; seen in 1 of 4 runs by hand, never in this row's runs.)"""
    kernel = tmp_path / "sigterms.py"
    kernel.write_text(SIGTERMS_FUZZ.format(kernels=str(Path(__file__).parent / "kernels"),
                                           killed=str(tmp_path / "killed")))
    code, out = cpsim(tmp_path, ["fuzz", "--kernel-v1", f"{kernel}:slot_mapping", "--kernel-abi", "callable",
                                 "--max-examples", "5", "--jobs", "2", "--no-db", "--out", str(tmp_path / "out")])
    assert "Traceback" not in out, out
    killed = (tmp_path / "killed").read_text() if (tmp_path / "killed").exists() else "(the kernel never ran)"
    assert code == 143, f"{out}\nworker -> fuzz pid it SIGTERMed:\n{killed}"
    assert "interrupted: SIGTERM" in out
    assert json.loads((tmp_path / "out" / "fuzz-summary.json").read_text())["interrupted"] == "SIGTERM"


SIGTERMS_ITS_JOB = '''
import os, signal, sys
sys.path.insert(0, {kernels!r})
from callable_abi import slot_mapping as _correct


def slot_mapping(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                 cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    """The kernel's worker's parent is a fuzz job process: SIGTERM it."""
    os.kill(os.getppid(), signal.SIGTERM)
    return _correct(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                    cp_world_size, cp_rank, cp_interleave, is_circular, pad_id)
'''


def test_a_kernel_that_sigterms_its_fuzz_job_is_exit_1_naming_it_not_an_internal_error(tmp_path):
    """The job's death is the kernel's deed (cpsim sent no SIGTERM): never exit 0, never cpsim's own
    "internal error" (exit 3); exit 1, one line naming the job and the signal, the summary kept."""
    kernel = tmp_path / "sigterms_job.py"
    kernel.write_text(SIGTERMS_ITS_JOB.format(kernels=str(Path(__file__).parent / "kernels")))
    code, out = cpsim(tmp_path, ["fuzz", "--kernel-v1", f"{kernel}:slot_mapping", "--kernel-abi", "callable",
                                 "--max-examples", "5", "--jobs", "2", "--no-db", "--quiet",
                                 "--out", str(tmp_path / "out")])
    assert "Traceback" not in out and "internal error" not in out, out
    assert code == 1, out
    text = " ".join(out.split())
    assert "was ended by SIGTERM, which cpsim did not send" in text, out
    summary = json.loads((tmp_path / "out" / "fuzz-summary.json").read_text())
    assert "SIGTERM" in summary["interrupted"] and "fuzz job" in summary["interrupted"]


# ---- item 3: torchrun endings (2 ranks) ------------------------------------------------------

KILLS_AGENT = '''
import os, signal, sys, time
sys.path.insert(0, {kernels!r})
from callable_abi import slot_mapping as _correct


def slot_mapping(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                 cp_world_size, cp_rank, cp_interleave, is_circular, pad_id):
    """On rank 1: SIGKILL torchrun's agent (the parent of the rank, which is the parent of this worker)."""
    if os.environ.get("RANK") == "1":
        rank = os.getppid()
        agent = int(open(f"/proc/{{rank}}/stat").read().rsplit(")", 1)[1].split()[1])
        os.kill(agent, signal.SIGKILL)
        time.sleep(30)
    return _correct(positions, req_indices, idx_mapping, block_table, block_size, kv_block_size,
                    cp_world_size, cp_rank, cp_interleave, is_circular, pad_id)
'''


def _torchrun(tmp_path: Path, args: list[str], during=None) -> tuple[int, str]:
    """``launch/cpu-sim.sh 2 ARGS`` with a marker in every process's environment: (exit code, output);
    asserts that no process it started is alive afterwards (``during(marker)`` runs meanwhile)."""
    import subprocess
    import uuid
    from test_dist import LAUNCH, ROOT, _env
    from test_hostile_kernel import _marked
    mark = f"cpsim-bounds-{uuid.uuid4().hex}"
    proc = subprocess.Popen([str(LAUNCH / "cpu-sim.sh"), "2", *args], cwd=ROOT, text=True,
                            env=_env(CPSIM_TEST_MARK=mark, TORCHRUN_ARGS=f"--log-dir {tmp_path / 'logs'}"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if during is not None:
        during(mark)
    out, _ = proc.communicate(timeout=240)
    end = time.monotonic() + 15
    while _marked(mark) and time.monotonic() < end:
        time.sleep(0.2)
    left = _marked(mark)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}\n{out[-3000:]}"
    return proc.returncode, out


def _kill_rank_1_at_startup(mark: str) -> None:
    """SIGKILL the rank-1 process a second after it appears: it is still importing (start-up)."""
    from test_hostile_kernel import _marked
    end = time.monotonic() + 60
    while time.monotonic() < end:
        for pid in _marked(mark):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"RANK=1" in env and b"-m\0cpsim\0" in cmd:
                time.sleep(1)
                os.kill(pid, signal.SIGKILL)
                return
        time.sleep(0.1)


@pytest.mark.dist
@pytest.mark.e2e
def test_a_rank_killed_at_startup_leaves_rank_0_json_and_no_traceback(tmp_path):
    js = tmp_path / "r.json"
    code, out = _torchrun(tmp_path, ["--scenario", "mtp", "--paths", "v1", "--timeout", "20", "--json", str(js)],
                          during=_kill_rank_1_at_startup)
    assert "Traceback" not in out, out[-3000:]
    assert code == 1, out[-3000:]
    assert json.loads(js.read_text())["passed"] is False


@pytest.mark.dist
@pytest.mark.e2e
def test_a_kernel_that_kills_the_torchrun_agent_leaves_rank_0_json_and_no_process(tmp_path):
    """The agent is the command the user started: it dies (137), but its ranks end with it (SIGTERM),
    rank 0 writes the report, and nothing prints a traceback or C++ frames."""
    kernel = tmp_path / "kills_agent.py"
    kernel.write_text(KILLS_AGENT.format(kernels=str(Path(__file__).parent / "kernels")))
    js = tmp_path / "r.json"
    code, out = _torchrun(tmp_path, ["--scenario", "mtp", "--paths", "v1", "--kernel-v1", f"{kernel}:slot_mapping",
                                     "--kernel-abi", "callable", "--timeout", "20", "--json", str(js)])
    assert "Traceback" not in out and "frame #" not in out, out[-3000:]
    assert code == -signal.SIGKILL, out[-3000:]
    report = json.loads(js.read_text())
    assert report["passed"] is False and "stopped" in report, report

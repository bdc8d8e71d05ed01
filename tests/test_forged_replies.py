"""Nothing a kernel worker sends back is unpickled or trusted (issue 35, item 1).

The kernels of tests/kernels/forged_replies.py write their own frame onto their worker's socket ahead
of the worker's genuine reply: a pickle whose payload would end the judge with exit 0, lengths and
headers past every limit, a wrong dtype, a reply for another rank, bytes that are not JSON, half a
frame. On every route that runs a user's kernel, cpsim must report a ``kernel-completes`` violation
(exit 1), print no traceback, write the requested report and leave no process; the pickle payload's
marker file must never appear. ``cpsim.run.wire``'s decoder is also fed malformed frames directly.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cpsim.run import wire
from test_hostile_kernel import ROOT, SMALL, cpsim, v1_capture  # noqa: F401  (v1_capture is a fixture)

FORGED = ROOT / "tests" / "kernels" / "forged_replies.py"
MODES = ["pickle", "huge-length", "huge-header", "wrong-dtype", "another-rank", "not-json", "truncated"]


@pytest.fixture
def forge(monkeypatch, tmp_path):
    """Set the forging mode; the path the pickle payload would write if the judge unpickled it."""
    mark = tmp_path / "payload-ran"
    monkeypatch.setenv("CPSIM_FORGE_MARK", str(mark))

    def mode(name: str) -> Path:
        monkeypatch.setenv("CPSIM_FORGE", name)
        return mark
    return mode


def _judged_a_violation(code: int, out: str, report: Path | None, mark: Path) -> str:
    assert not mark.exists(), "the kernel's pickle ran in the judging process"
    assert "Traceback" not in out, out
    assert code == 1, out
    text = " ".join(out.split())
    if report is not None:
        data = json.loads(report.read_text())
        assert data["passed"] is False
        text += " " + " ".join(json.dumps(data).split())
    assert "kernel-completes" in text, out
    return text


@pytest.mark.parametrize("mode", MODES)
def test_a_forged_reply_on_cpsim_run_is_a_violation_on_its_rank(tmp_path, forge, mode):
    mark = forge(mode)
    report = tmp_path / "r.json"
    extra = ["--kernel-timeout", "10"] if mode == "truncated" else []
    code, out = cpsim(tmp_path, [*SMALL, "--kernel-v1", f"{FORGED}:kernel", "--json", str(report), *extra])
    text = _judged_a_violation(code, out, report, mark)
    assert "on rank 0" in text
    phrase = "exceeded 10 s" if mode == "truncated" else "not well-formed plain data"
    assert phrase in text, out


ROUTES = {
    "replay an explicit batch": ["replay", str(ROOT / "examples" / "explicit-shuffled-positions.json"),
                                 "--kernel-v1", f"{FORGED}:ascend_v1"],
    # Seeded: unseeded, a fresh-clone run once drew 2 examples that raised nothing (exit 0);
    # shrinking runs the same kernel, on the same route, again.
    "fuzz": ["fuzz", "--kernel-v1", f"{FORGED}:kernel", "--paths", "v1", "--max-examples", "2", "--seed", "0",
             "--shrink-seconds", "0"],
    "sweep": ["sweep", "--presets", "mtp", "--cp", "2", "--paths", "v1", "--kernel-v1", f"{FORGED}:kernel"],
    "draw": ["draw", "--scenario", "mtp", "--dcp", "2", "--paths", "v1", "--kernel-v1", f"{FORGED}:kernel",
             "--out", "d.png"],
}


@pytest.mark.slow
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_pickled_reply_never_runs_in_the_judge_on_any_route(tmp_path, forge, route):
    mark = forge("pickle")
    report = tmp_path / "r.json"
    args = ROUTES[route] + ([] if route in ("fuzz", "draw") else ["--json", str(report)])
    code, out = cpsim(tmp_path, args)
    assert not mark.exists(), "the kernel's pickle ran in the judging process"
    assert "Traceback" not in out, out
    assert code == 1, out
    if route not in ("fuzz", "draw"):
        _judged_a_violation(code, out, report, mark)


def test_a_pickled_reply_on_replay_of_a_capture(tmp_path, forge, v1_capture):  # noqa: F811
    mark = forge("pickle")
    report = tmp_path / "r.json"
    code, out = cpsim(tmp_path, ["replay", str(v1_capture), "--kernel-v1", f"{FORGED}:ascend_v1",
                                 "--json", str(report)])
    _judged_a_violation(code, out, report, mark)


@pytest.mark.dist
@pytest.mark.e2e
def test_a_pickled_reply_under_torchrun(tmp_path, forge):
    mark = forge("pickle")
    report = tmp_path / "r.json"
    proc = subprocess.run([str(ROOT / "launch" / "cpu-sim.sh"), "2", "--scenario", "mtp", "--paths", "v1",
                           "--kernel-v1", f"{FORGED}:kernel", "--json", str(report), "--timeout", "120"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "PY": sys.executable})
    out = proc.stdout + proc.stderr
    assert not mark.exists(), "the kernel's pickle ran in the judging process"
    assert proc.returncode == 1, out
    data = json.loads(report.read_text())
    assert data["passed"] is False
    assert "kernel-completes" in json.dumps(data)


def test_a_pickled_reply_under_the_pytest_plugin(tmp_path, forge):
    mark = forge("pickle")
    (tmp_path / "test_user.py").write_text("def test_theirs():\n    assert True\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--cpsim-kernel-v1", f"{FORGED}:kernel", "--cpsim-scenarios", "mtp"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    out = proc.stdout + proc.stderr
    assert not mark.exists(), "the kernel's pickle ran in the judging process"
    assert proc.returncode == 1, out
    assert "kernel-completes" in out, out


# ---- the decoder, fed frames directly ---------------------------------------------------------------

def _done(**change) -> wire.RankDone:
    out = wire.RankOutputData(np.arange(6, dtype=np.int64).reshape(2, 3), [True, False], [4, 4], [16, 16],
                              np.zeros((2, 4), np.int64), np.zeros((2, 3), np.int64), None)
    return wire.RankDone(**{"path": "v1", "rank": 1, "output": out, "notes": ["n"], **change})


def test_every_message_round_trips():
    msgs = [wire.Ready(), _done(), _done(output=None), wire.Batch([_done(), wire.Raised("E", "t", "g0")]),
            wire.Refused("--x", "rule"), wire.Unloaded("exited", "m"), wire.Raised("ValueError", "boom", "*"),
            wire.Exited("0", "*"), wire.LostOnReadback("E", "t"),
            wire.SignatureRead("k", True, False, [("a", False), ("b", True)], "vllm", "0.26.0"),
            wire.Value([np.array([[1, -1]], dtype=np.int64)], False, ["note"]),
            wire.Value([np.zeros((2, 3), np.int64), np.ones((2, 4), np.int64)], True, [])]
    for m in msgs:
        got = wire.decode(wire.encode(m))
        assert type(got) is type(m)
        assert repr(got) == repr(m)


def _header(frame: bytes) -> dict:
    (n,) = struct.unpack_from("!I", frame, 4)
    return json.loads(frame[8:8 + n])


def _with_header(frame: bytes, header: dict) -> bytes:
    (n,) = struct.unpack_from("!I", frame, 4)
    head = json.dumps(header).encode()
    return b"CPW1" + struct.pack("!I", len(head)) + head + frame[8 + n:]


def _edit(change) -> bytes:
    frame = wire.encode(_done())
    h = _header(frame)
    change(h)
    return _with_header(frame, h)


def _enabled_two() -> bytes:
    frame = bytearray(wire.encode(_done()))
    (n,) = struct.unpack_from("!I", frame, 4)
    struct.pack_into("=q", frame, 8 + n, 2)  # the first per-group number: group 0's enabled flag
    return bytes(frame)


BAD = {
    "a pickle": lambda: __import__("pickle").dumps(("ok", None, [])),
    "empty": lambda: b"",
    "cut in the header": lambda: wire.encode(_done())[:20],
    "cut in the numbers": lambda: wire.encode(_done())[:-8],
    "a byte too many": lambda: wire.encode(_done()) + b"\0",
    "a number too many": lambda: wire.encode(_done()) + b"\0" * 8,
    "unknown type": lambda: _edit(lambda h: h.update(type="Exec")),
    "a dtype of its own": lambda: _edit(lambda h: h.update(arrays=[{"dtype": "object", "shape": [1]}])),
    "more entries than sent": lambda: _edit(lambda h: h["fields"]["output"].update(entries=1000)),
    "negative size": lambda: _edit(lambda h: h["fields"]["output"].update(groups=-2)),
    "size not an integer": lambda: _edit(lambda h: h["fields"]["output"].update(entries=3.0)),
    "an extra field": lambda: _edit(lambda h: h["fields"].update(evil=1)),
    "a missing field": lambda: _edit(lambda h: h["fields"].pop("notes")),
    "rank not an integer": lambda: _edit(lambda h: h["fields"].update(rank="1")),
    "enabled not 0 or 1": _enabled_two,
    "a batch in a batch": lambda: wire.encode(wire.Batch([wire.Batch([])])),
    "an unknown load kind": lambda: wire.encode(wire.Unloaded("pickled", "m")),
    "huge header length": lambda: b"CPW1" + struct.pack("!I", 1 << 31) + b"{}",
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_malformed_frame_is_refused_naming_why(name):
    with pytest.raises(wire.Malformed):
        wire.decode(BAD[name]())


def test_read_frame_refuses_a_length_past_the_limit_before_reading_it():
    import socket
    a, b = socket.socketpair()
    b.sendall(struct.pack("!i", -1) + struct.pack("!Q", 1 << 40))
    with pytest.raises(wire.Malformed):
        wire.read_frame(a.fileno(), 5, lambda: False)
    a.close()
    b.close()


def test_read_frame_gives_up_on_half_a_frame_at_its_deadline():
    import socket
    import time
    a, b = socket.socketpair()
    b.sendall(struct.pack("!i", 100) + b"x" * 10)
    t = time.monotonic()
    with pytest.raises(TimeoutError):
        wire.read_frame(a.fileno(), 0.5, lambda: False)
    assert time.monotonic() - t < 5
    a.close()
    b.close()

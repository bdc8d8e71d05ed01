"""A slot buffer of a dtype the kernel's ABI does not name (issue 37, item 4): ``limits.slot_buffer_dtype``.

The host allocates the slot buffer, not the kernel: vLLM's v1 and MRV2 hosts int64
(``vllm/v1/worker/block_table.py``, ``gpu/block_table.py``), vllm-ascend's int32
(``vllm_ascend/worker/block_table.py``, ``worker/v2/block_table.py``). Triton casts a store to the buffer's
dtype, so the values judged are the ones that host would read back: int32 -1 and int64 -1 are both PAD, a
slot past 2^31 in an int32 buffer wraps, a uint32 store into an int64 buffer reads PAD as 2^32 - 1.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path

import pytest

from cpsim import cli
from cpsim.capture import batch
from cpsim import scenario as sc
from cpsim.errors import ConfigError
from cpsim.fuzz import space
from cpsim.presets import preset
from cpsim.stack import host
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm
from test_dist import cpu_sim
from test_stack import VLLM_READY, VLLM_SKIP, vllm_args

K = Path(__file__).parent / "kernels"
MRV2_OK = f"{K}/vllm_mrv2_032_abi.py:_compute_slot_mappings_kernel"       # int64 ABI
ASCEND_V2_OK = f"{K}/ascend_v2_abi.py:_compute_slot_mappings_kernel"      # int32 ABI
UINT32_STORE = f"{K}/ascend_v2_uint32_store.py:_compute_slot_mappings_kernel"
CALLABLE = f"{K}/callable_abi.py:slot_mapping"
WRONG_VALUES = {"dense-local", "matches-reference", "no-collision"}


def _file(tmp_path, name: str, dtype: str) -> str:
    s = preset(name)
    path = tmp_path / f"{name}-{dtype}.json"
    s.replace(limits=dataclasses.replace(s.limits, slot_buffer_dtype=dtype)).dump(path)
    return str(path)


def _run(tmp_path, *args) -> tuple[int, set[str]]:
    out = tmp_path / "r.json"
    rc = cli.main(["run", "--quiet", "--json", str(out), *args], runner=RUNNER)
    rep = json.loads(out.read_text())
    return rc, {v["invariant"] for v in rep["verdicts"] if v["status"] == "fail"}


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("path, spec", [("v2", MRV2_OK), ("v2", ASCEND_V2_OK), ("v1", CALLABLE)],
                         ids=["vllm-mrv2-0.32", "ascend-v2", "callable"])
def test_a_correct_kernel_passes_with_either_buffer(tmp_path, path, spec, dtype):
    """Slots below 2^31: PAD is -1 in either buffer, so the same kernel passes in both."""
    rc, failed = _run(tmp_path, "--scenario", _file(tmp_path, "graph-padding", dtype), "--paths", path,
                      f"--kernel-{path}", spec)
    assert (rc, failed) == (0, set())


@pytest.mark.parametrize("path, spec", [("v2", MRV2_OK), ("v1", CALLABLE)], ids=["vllm-mrv2-0.32", "callable"])
def test_an_int64_kernel_handed_an_int32_buffer_wraps_past_2_31(tmp_path, path, spec):
    """huge-cache's second group reaches slot 2^32: stored into an int32 buffer it wraps, and the wrapped
    slot is judged as it reads back (sign-extended), not as the kernel computed it."""
    args = ["--paths", path, f"--kernel-{path}", spec]
    assert _run(tmp_path, "--scenario", _file(tmp_path, "huge-cache", "int64"), *args) == (0, set())
    rc, failed = _run(tmp_path, "--scenario", _file(tmp_path, "huge-cache", "int32"), *args)
    assert rc == 1 and WRONG_VALUES <= failed


def test_a_uint32_store_fails_only_in_an_int64_buffer(tmp_path):
    """The twin passes in its ABI's int32 buffer (PAD bits 0xFFFFFFFF read back as -1) and fails in an
    int64 one, where the same store reads back as 4294967295: a defect no ABI-default scenario shows."""
    args = ["--paths", "v2", "--kernel-v2", UINT32_STORE]
    assert _run(tmp_path, "--scenario", "graph-padding", *args) == (0, set())
    assert _run(tmp_path, "--scenario", _file(tmp_path, "graph-padding", "int32"), *args) == (0, set())
    rc, failed = _run(tmp_path, "--scenario", _file(tmp_path, "graph-padding", "int64"), *args)
    assert rc == 1 and WRONG_VALUES | {"exactly-one-owner"} <= failed


def test_a_run_says_which_built_in_paths_keep_their_int64_buffer(tmp_path, capsys):
    """The field is for a kernel under test: where cpsim's own kernels run, the run says so, not nothing."""
    scenario = _file(tmp_path, "graph-padding", "int32")
    assert cli.main(["run", "--scenario", scenario, "--paths", "v1,v2", "--kernel-v2", MRV2_OK], runner=RUNNER) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "note: limits.slot_buffer_dtype int32 reaches a kernel under test; cpsim's built-in kernels on v1 keep " \
           "their int64 buffer" in out
    assert cli.main(["run", "--scenario", scenario, "--paths", "v2", "--kernel-v2", MRV2_OK], runner=RUNNER) == 0
    assert "slot_buffer_dtype" not in capsys.readouterr().out


@pytest.mark.parametrize("value", ["int16", "INT32", 64, None])
def test_a_bad_dtype_is_exit_2_naming_the_field(tmp_path, capsys, value):
    d = preset("default").to_dict()
    d["limits"]["slot_buffer_dtype"] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    assert cli.main(["run", "--quiet", "--scenario", str(path)], runner=RUNNER) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "limits.slot_buffer_dtype" in err and "abi, int32, int64" in err


def test_validate_refuses_a_dtype_built_in_code():
    s = preset("default")
    with pytest.raises(ConfigError) as e:
        sc.validate(s.replace(limits=dataclasses.replace(s.limits, slot_buffer_dtype="uint32")))
    assert e.value.field == "limits.slot_buffer_dtype"


def test_the_default_is_left_out_of_the_fingerprint():
    """Every scenario written before the field keeps its fingerprint; a forced dtype changes it."""
    s = preset("default")
    assert "slot_buffer_dtype" not in s.to_dict()["limits"]
    forced = s.replace(limits=dataclasses.replace(s.limits, slot_buffer_dtype="int64"))
    assert forced.fingerprint() != s.fingerprint()
    assert sc.Scenario.from_dict(forced.to_dict()) == forced


# ---- stack runs: the host allocates its own buffer --------------------------------------------------

@pytest.mark.parametrize("family, honoured, refused", [("vllm", "int64", "int32"), ("vllm-ascend", "int32", "int64")])
def test_a_stack_run_honours_only_its_hosts_dtype(family, honoured, refused):
    s = preset("default")
    for dtype in ("abi", honoured):
        host.host_slot_dtype(s.replace(limits=dataclasses.replace(s.limits, slot_buffer_dtype=dtype)), family, None)
    with pytest.raises(ConfigError) as e:
        host.host_slot_dtype(s.replace(limits=dataclasses.replace(s.limits, slot_buffer_dtype=refused)), family, None)
    assert e.value.field == "limits.slot_buffer_dtype" and honoured in e.value.rule


def test_a_stack_run_of_own_classes_with_a_forced_dtype_is_exit_2(tmp_path, capsys):
    hosts = Path(__file__).parent / "stack_hosts"
    code = cli.main(["run", "--quiet", "--scenario", _file(tmp_path, "default", "int32"), "--stack", "vllm-ascend",
                     "--paths", "v1", "--stack-python", sys.executable, "--stack-classes",
                     str(hosts / "ascend_shape.py")], runner=RUNNER)
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "limits.slot_buffer_dtype" in err


@pytest.mark.skipif(not VLLM_READY, reason=VLLM_SKIP)
def test_vllm_033_host_honours_int64_and_refuses_int32(tmp_path, capsys):
    """vLLM 0.33.0's hosts allocate int64: a scenario naming int64 is judged as it stands, int32 is exit 2."""
    args = ["--stack", "vllm", "--paths", "v1,v2", *vllm_args()]
    assert _run(tmp_path, "--scenario", _file(tmp_path, "default", "int64"), *args) == (0, set())
    capsys.readouterr()
    code = cli.main(["run", "--quiet", "--scenario", _file(tmp_path, "default", "int32"), *args], runner=RUNNER)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "limits.slot_buffer_dtype" in err


@pytest.mark.dist
@pytest.mark.e2e
def test_under_torchrun_a_forced_dtype_is_exit_2_on_every_rank_in_one_line(tmp_path):
    """Each rank's request is refused before its driver starts: every rank answers "refused" to the gather
    (before, the refusal raised on each rank ahead of it)."""
    proc = cpu_sim(2, "--dcp", "2", "--scenario", _file(tmp_path, "default", "int32"), "--stack", "vllm-ascend",
                   "--paths", "v1", "--stack-python", sys.executable, "--stack-classes",
                   str(Path(__file__).parent / "stack_hosts" / "ascend_shape.py"), "--timeout", "60", "--quiet")
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "limits.slot_buffer_dtype" in errors[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


# ---- the default fuzz space -------------------------------------------------------------------------

def test_the_default_space_draws_either_buffer_and_keeps_int32_ones_below_2_31():
    drawn = [space.build(space.RandomDraw(random.Random(i))) for i in range(400)]
    by = {d: [s for s in drawn if s.limits.slot_buffer_dtype == d] for d in sc.SLOT_BUFFER_DTYPES}
    assert len(by["abi"]) > 250 and len(by["int32"]) > 20 and len(by["int64"]) > 20
    assert not any(g.num_blocks * g.block_size > 2**31 for s in by["int32"] for g in s.groups)


def test_default_fuzz_finds_the_uint32_store(tmp_path):
    """Within 300 examples of the default space (seed 0: after 7), put on the new dimension."""
    rc = cli.main(["fuzz", "--paths", "v2", "--kernel-v2", UINT32_STORE, "--max-examples", "300", "--seed", "0",
                   "--stop-after-first", "--out", str(tmp_path), "--quiet"], runner=RUNNER)
    assert rc == 1
    (repro,) = tmp_path.glob("repro-*.json")
    data = json.loads(repro.read_text())
    assert data["scenario"]["limits"]["slot_buffer_dtype"] == "int64"
    assert data["fuzz"]["signature"].endswith(":slot-buffer-dtype")


def test_an_explicit_batch_writes_the_dtype_only_when_it_is_not_the_abis(tmp_path):
    """Repros written before the field keep the limits a run writes now; a chosen dtype comes back."""
    src = Path(__file__).resolve().parents[1] / "data" / "upstream" / "repros" / "vllm_0.34.0-host-huge-cache-v2.json"
    step = batch.load(src)
    again = json.loads(batch.save(step, tmp_path / "same.json").read_text())
    assert again["limits"] == json.loads(src.read_text())["limits"] and "slot_buffer_dtype" not in again["limits"]
    chosen = dataclasses.replace(step, limits=dataclasses.replace(step.limits, slot_buffer_dtype="int32"))
    path = batch.save(chosen, tmp_path / "int32.json")
    assert json.loads(path.read_text())["limits"]["slot_buffer_dtype"] == "int32"
    assert batch.load(path).limits.slot_buffer_dtype == "int32"


def test_replay_hands_an_explicit_batchs_dtype_to_a_released_kernel(tmp_path):
    """vLLM 0.34.0's huge-cache step (rank 0's slot past 2^31): our MRV2 kernel passes in its ABI's int64
    buffer and, rerun by ``replay`` with the batch's int32 buffer, wraps there as it would on that host."""
    src = Path(__file__).resolve().parents[1] / "data" / "upstream" / "repros" / "vllm_0.34.0-host-huge-cache-v2.json"
    data = json.loads(src.read_text())

    def replay(limits: dict) -> tuple[int, dict]:
        batch, out = tmp_path / "batch.json", tmp_path / "replay.json"
        batch.write_text(json.dumps({**data, "limits": limits}))
        rc = cli.main(["replay", str(batch), "--kernel-v2", MRV2_OK, "--json", str(out), "--quiet"], runner=RUNNER)
        return rc, json.loads(out.read_text())

    rc, rep = replay(data["limits"])
    assert rc == 0 and rep["passed"]
    rc, rep = replay({**data["limits"], "slot_buffer_dtype": "int32"})
    failed = {v["invariant"] for v in rep["verdicts"] if v["status"] == "fail"}
    assert rc == 1 and {"dense-local", "matches-reference"} <= failed

"""The plain-data gather between cpsim's ranks (cpsim.run.plain): what a rank sends is rebuilt only as the
classes the reader names, never unpickled."""

import base64
import json
import pickle

import numpy as np
import pytest

from cpsim.check.coordinator import Example, Verdict, Violation
from cpsim.presets import preset
from cpsim.run import plain
from cpsim.run.distrun import RESULT_CLASSES, GroupResult


def _result(name: str) -> GroupResult:
    bad = Violation("dense-local", "v1", "g0", 2, "two off", [1], [Example(1, 0, 7, "block 1", "block 0")])
    return GroupResult(name, 0, [0, 1], preset(name), [Verdict("dense-local", "v1", "fail", 9, [bad]),
                                                         Verdict("padding", "v2", "pass", 4)], ["v1-torch"])


@pytest.mark.parametrize("name", ["default", "hybrid-mamba", "graph-padding", "tail-group"])
def test_a_group_result_comes_back_equal(name):
    r = _result(name)
    back = plain.decode(plain.encode(r), RESULT_CLASSES)
    assert back == r and back.scenario.fingerprint() == r.scenario.fingerprint()


def test_arrays_tuples_and_int_keys_come_back_with_their_types():
    x = {"arrays": {"slots": np.arange(-3, 9, dtype=np.int64).reshape(3, 4)}, "refused": ("field", "rule"),
         "by_rank": {0: [1.5], 1: []}}
    back = plain.decode(plain.encode(x))
    assert back["arrays"]["slots"].dtype == np.int64 and (back["arrays"]["slots"] == x["arrays"]["slots"]).all()
    assert back["refused"] == ("field", "rule") and back["by_rank"] == {0: [1.5], 1: []}


def test_a_pickle_is_refused():
    with pytest.raises(plain.PlainError, match="not JSON"):
        plain.decode(pickle.dumps(_result("default")), RESULT_CLASSES)


def test_a_class_the_reader_did_not_name_is_refused():
    data = plain.encode(_result("default"))
    with pytest.raises(plain.PlainError, match="'GroupResult' is not one"):
        plain.decode(data, (Verdict,))
    forged = json.dumps({"__dc__": "Popen", "fields": {"args": ["sh", "-c", "exit 0"]}}).encode()
    with pytest.raises(plain.PlainError, match="'Popen' is not one"):
        plain.decode(forged, RESULT_CLASSES)


def test_a_field_the_class_does_not_have_is_refused():
    forged = json.dumps({"__dc__": "Verdict", "fields": {"invariant": "x", "path": "v1", "status": "pass",
                                                         "__class__": "y"}}).encode()
    with pytest.raises(plain.PlainError, match="no field"):
        plain.decode(forged, RESULT_CLASSES)


@pytest.mark.parametrize("spec, match", [
    (["|O", [1], base64.b64encode(b"\0" * 8).decode()], "not a numeric array"),
    (["<i8", [4], base64.b64encode(b"\0" * 8).decode()], "with 8 bytes"),
    (["<i8", [-1], ""], "not a numeric array"),
    (["nonsense", [1], ""], "unknown dtype"),
])
def test_a_malformed_array_is_refused(spec, match):
    with pytest.raises(plain.PlainError, match=match):
        plain.decode(json.dumps({"__nd__": spec}).encode())


def test_a_payload_past_the_limit_or_too_deep_is_refused(monkeypatch):
    deep = "[" * (plain.MAX_DEPTH + 2) + "]" * (plain.MAX_DEPTH + 2)
    with pytest.raises(plain.PlainError, match="deeper"):
        plain.decode(deep.encode())
    monkeypatch.setattr(plain, "MAX_BYTES", 16)
    with pytest.raises(plain.PlainError, match="past the 16-byte limit"):
        plain.decode(plain.encode(list(range(100))))


def test_an_object_that_is_not_plain_data_is_not_sent():
    with pytest.raises(TypeError, match="not plain data"):
        plain.encode({"f": lambda: 0})

"""Bad input, one row each: exit 2, one line naming the field and the rule, never a traceback.

Rows run ``cpsim.cli.main(argv)`` in process (an exception escaping it fails the row);
a few run ``python -m cpsim`` to show that nothing but the one line reaches the terminal.
Each row is refused before any kernel runs, so the table is fast. Good inputs
(presets, examples/, round trips) are checked to still load at the end.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from cpsim import schema
from cpsim import scenario as sc
from cpsim.presets import PRESETS, preset
from cpsim.random_scenarios import random_scenario
from cpsim.validate import load_scenario
from cpsim.cli import main
from cpsim.errors import ConfigError
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "small-cp4.json"
CALLABLE = f"{ROOT}/tests/kernels/callable_abi.py:slot_mapping"


def good() -> dict[str, Any]:
    return json.loads(EXAMPLE.read_text())


def edited(change: Callable[[dict], Any]) -> dict:
    d = good()
    change(d)
    return d


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A change that sets ``a.b[0].c`` to ``value``."""
    def change(d: dict) -> None:
        keys = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return change


def _rename(old: str, new: str, where: str = "") -> Callable[[dict], None]:
    def change(d: dict) -> None:
        parent = d[where] if where else d
        parent[new] = parent.pop(old)
    return change


# ---- the files a row writes into tmp_path ---------------------------------------------------

def json_file(data: Any, name: str = "s.json") -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        p = tmp / name
        p.write_text(json.dumps(data))
        return p
    return make


def text_file(text: str | bytes, name: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        p = tmp / name
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        return p
    return make


def a_directory(name: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        (tmp / name).mkdir()
        return tmp / name
    return make


def repro(change: Callable[[dict], Any] | None = None, name: str = "repro.json") -> Callable[[Path], Path]:
    """A valid repro file of the example scenario (as cpsim fuzz writes it), then ``change``d."""
    def make(tmp: Path) -> Path:
        from cpsim import fuzz as fz
        from cpsim.paths import Knobs
        s = load_scenario(EXAMPLE)
        written = fz.write_repro(tmp / "out", fz.Repro(s, ["v1", "v2"], Knobs(), None,
                                                       {"invariants": [], "failures": [], "error": None}))
        data = json.loads(written.read_text())
        if change:
            change(data)
        p = tmp / name
        p.write_text(json.dumps(data))
        return p
    return make


def toml_scenario(extra: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        import tomli_w
        p = tmp / "s.toml"
        p.write_text(tomli_w.dumps(good()) + extra)
        return p
    return make


# ---- capture files and explicit batches (docs/CAPTURE.md) ------------------------------------

EXPLICIT = ROOT / "examples" / "explicit-shuffled-positions.json"


def explicit(change: Callable[[dict], Any] | None = None, raw: Callable[[str], str] | None = None,
             name: str = "x.json") -> Callable[[Path], Path]:
    """The shuffled-positions explicit batch, ``change``d as data or its text edited by ``raw``."""
    def make(tmp: Path) -> Path:
        p = tmp / name
        if raw is not None:
            p.write_text(raw(EXPLICIT.read_text()))
        else:
            d = json.loads(EXPLICIT.read_text())
            change(d)
            p.write_text(json.dumps(d))
        return p
    return make


def explicit_npz(meta: Callable[[dict], Any] | None = None, arrays: dict | None = None,
                 cut: bool = False) -> Callable[[Path], Path]:
    """The same batch as a ``.npz`` archive: its meta.json ``meta``-changed, arrays replaced, or the file cut short."""
    def make(tmp: Path) -> Path:
        import numpy as np
        from cpsim.capture.archive import ArchiveWriter
        d = json.loads(EXPLICIT.read_text())
        a = {k: np.asarray(v) for k, v in d.pop("arrays").items()} | (arrays or {})
        if meta:
            meta(d)
        p = tmp / "x.npz"
        with ArchiveWriter(p) as w:
            w.json("meta", d)
            for k, v in a.items():
                w.array(k, v)
        if cut:
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        return p
    return make


def capture_file(header: dict | None = None, launch: dict | None = None, scalars: dict | None = None,
                 arrays: dict | None = None, raw: bytes | None = None) -> Callable[[Path], Path]:
    """A one-rank, one-launch v1 capture written by hand (it replays clean: tests below), then edited."""
    def make(tmp: Path) -> Path:
        import numpy as np
        from cpsim.capture.archive import ArchiveWriter
        p = tmp / "rank0.cpcap"
        if raw is not None:
            p.write_bytes(raw)
            return p
        h = {"format": "cpsim-capture", "version": 1, "rank": 0, "pid": 1, "host": "h", "created": "now",
             "policy": {"every": 1, "first": 0, "last": None, "budget": 1 << 30, "ranks": None}, "meta": {}}
        s = {"TOTAL_CP_WORLD_SIZE": 1, "TOTAL_CP_RANK": 0, "CP_KV_CACHE_INTERLEAVE_SIZE": 1, "KV_CACHE_BLOCK_SIZE": 4,
             "block_size": 4, "max_num_tokens": 4, "num_tokens": 4, "IS_CIRCULAR": False, "block_table_stride": 1}
        lm = {"kernel": "cpsim.kernels.triton_v1:_compute_slot_mapping_kernel", "family": "v1", "params": [],
              "grid": [2], "step": 0, "call": 0, "rank": 0, "scalars": s | (scalars or {})}
        a = {"positions_ptr": np.arange(4), "query_start_loc_ptr": np.array([0, 4]),
             "block_table_ptr": np.array([[3]], dtype=np.int32), "slot_mapping_ptr": np.arange(12, 16)}
        with ArchiveWriter(p) as w:
            w.json("capture", h | (header or {}))
            w.json("s00000000/c000/meta", lm | (launch or {}))
            for k, v in (a | (arrays or {})).items():
                w.array("s00000000/c000/" + k, v)
        return p
    return make


@dataclass
class Row:
    id: str
    argv: list[str]                       # "{f}" is replaced by the file ``make`` writes, "{tmp}" by tmp_path
    phrase: str                           # a key phrase of the one-line message
    make: Callable[[Path], Path] | None = None
    code: int = 2


def run_row(row: Row, tmp: Path) -> list[str]:
    f = row.make(tmp) if row.make else None
    return [a.replace("{f}", str(f)).replace("{tmp}", str(tmp)) for a in row.argv]


SCENARIO = ["run", "--scenario", "{f}"]
REPLAY = ["replay", "{f}", "--quiet"]

ROWS = [
    # -- scenario files: what the file is --
    Row("scenario-is-a-directory", SCENARIO, "is a directory", a_directory("d.json")),
    Row("scenario-missing", ["run", "--scenario", "{tmp}/nope.json"], "does not exist"),
    Row("scenario-json-list", SCENARIO, "must hold one JSON object", json_file([1, 2])),
    Row("scenario-json-number", SCENARIO, "must hold one JSON object", json_file(5)),
    Row("scenario-json-string", SCENARIO, "must hold one JSON object", json_file("default")),
    Row("scenario-binary", SCENARIO, "not a text file", text_file(b"\x89PNG\r\n\x1a\n\x00\x00\x00", "b.json")),
    Row("scenario-not-utf8", SCENARIO, "not a text file", text_file(b'{"name": "\xff\xfe"}', "u.json")),
    Row("scenario-empty-file", SCENARIO, "not valid JSON", text_file("", "e.json")),
    Row("scenario-bad-json", SCENARIO, "not valid JSON", text_file("{nope", "x.json")),
    Row("scenario-bad-toml", SCENARIO, "not valid TOML", text_file("seed = = 1", "x.toml")),
    Row("scenario-toml-inf", SCENARIO, "NaN and infinity are not allowed", toml_scenario("\n[extra]\nx = inf\n")),
    Row("scenario-toml-nan-field", SCENARIO, "batch.num_tokens_padded", text_file(
        'groups = [{name = "a"}]\n[batch]\nrequests = [{context_len = 0, num_tokens = 4}]\nnum_tokens_padded = nan\n',
        "n.toml")),
    Row("scenario-duplicate-key", SCENARIO, "appears twice", text_file(
        EXAMPLE.read_text().replace('"seed": 0', '"seed": 0, "seed": 1'), "dup.json")),
    Row("scenario-unknown-suffix", ["run", "--scenario", "s.yaml"], "neither a preset"),
    Row("preset-misspelt", ["run", "--scenario", "defualt"], "did you mean 'default'"),
    # -- scenario files: keys --
    Row("batch-key-misspelt", SCENARIO, "unknown key 'bacth'; did you mean 'batch'", json_file(
        edited(_rename("batch", "bacth")))),
    Row("batch-missing", SCENARIO, "scenario.batch", json_file(edited(lambda d: d.pop("batch")))),
    Row("interleave-misspelt-in-cp", SCENARIO, "unknown key 'interleve'; did you mean 'interleave'",
        json_file(edited(_rename("interleave", "interleve", "cp")))),
    Row("interleave-misspelt-top-level", SCENARIO, "did you mean 'cp.interleave'",
        json_file(edited(_set("interleve", 8)))),
    Row("unknown-top-level-key", SCENARIO, "unknown key 'comment'; allowed keys", json_file(
        edited(_set("comment", "hi")))),
    Row("group-key-misspelt", SCENARIO, "did you mean 'block_size'", json_file(
        edited(lambda d: d["groups"][0].__setitem__("blocksize", d["groups"][0].pop("block_size"))))),
    Row("request-key-misspelt", SCENARIO, "did you mean 'num_tokens'", json_file(
        edited(lambda d: d["batch"]["requests"][0].__setitem__("num_token", 3)))),
    Row("groups-missing", SCENARIO, "scenario.groups", json_file(edited(lambda d: d.pop("groups")))),
    Row("groups-empty", SCENARIO, "at least 1 item", json_file(edited(_set("groups", [])))),
    Row("requests-empty", SCENARIO, "batch.requests", json_file(edited(_set("batch.requests", [])))),
    # -- scenario files: types --
    Row("batch-as-list", SCENARIO, "batch: must be an object", json_file(edited(_set("batch", [])))),
    Row("cp-as-number", SCENARIO, "scenario.cp", json_file(edited(_set("cp", 4)))),
    Row("idx-mapping-strings", SCENARIO, "idx_mapping[0]: must be a valid integer", json_file(
        edited(_set("batch.idx_mapping", ["2", "0", "3", "1"])))),
    Row("idx-mapping-floats", SCENARIO, "idx_mapping[0]: must be a valid integer", json_file(
        edited(_set("batch.idx_mapping", [2.0, 0.5, 3, 1])))),
    Row("num-tokens-padded-nan", SCENARIO, "num_tokens_padded", text_file(
        EXAMPLE.read_text().replace('"num_tokens_padded": 280', '"num_tokens_padded": NaN'), "nan.json")),
    Row("num-tokens-padded-inf", SCENARIO, "NaN and infinity", text_file(
        EXAMPLE.read_text().replace('"num_tokens_padded": 280', '"num_tokens_padded": Infinity'), "inf.json")),
    Row("num-tokens-padded-str", SCENARIO, "num_tokens_padded: must be a valid integer, got '280'", json_file(
        edited(_set("batch.num_tokens_padded", "280")))),
    Row("seed-negative", SCENARIO, "seed: must be greater than or equal to 0", json_file(edited(_set("seed", -1)))),
    Row("seed-string", SCENARIO, "seed: must be a valid integer", json_file(edited(_set("seed", "3")))),
    Row("group-name-list", SCENARIO, "groups[0].name: must be a valid string", json_file(
        edited(_set("groups[0].name", ["attn"])))),
    Row("group-kind-misspelt", SCENARIO, "did you mean 'attention'", json_file(
        edited(_set("groups[0].kind", "atention")))),
    Row("cp-sharded-string-no", SCENARIO, "cp_sharded: must be a valid boolean, got 'no'", json_file(
        edited(_set("groups[0].cp_sharded", "no")))),
    Row("cp-sharded-int", SCENARIO, "cp_sharded: must be a valid boolean", json_file(
        edited(_set("groups[0].cp_sharded", 1)))),
    Row("block-size-bool", SCENARIO, "block_size: must be a valid integer, got true", json_file(
        edited(_set("groups[0].block_size", True)))),
    Row("block-size-float", SCENARIO, "block_size: must be a valid integer", json_file(
        edited(_set("groups[0].block_size", 64.0)))),
    Row("allow-invalid-string", SCENARIO, "allow_invalid: must be a valid boolean", json_file(
        edited(_set("allow_invalid", "false")))),
    # -- scenario files: ranges, with the reason --
    Row("block-size-2-40", SCENARIO, "no runtime uses blocks", json_file(edited(_set("groups[0].block_size", 2**40)))),
    Row("max-model-len-1e18", SCENARIO, "max_model_len: must be less than or equal to", json_file(
        edited(_set("limits.max_model_len", 10**18)))),
    Row("max-num-batched-tokens-1e18", SCENARIO, "max_num_batched_tokens: must be less than or equal to",
        json_file(edited(_set("limits.max_num_batched_tokens", 10**18)))),
    Row("num-blocks-above-int32", SCENARIO, "block ids are int32", json_file(
        edited(_set("groups[0].num_blocks", 2**31)))),
    Row("dcp-zero-in-file", SCENARIO, "cp.dcp: must be greater than or equal to 1", json_file(edited(_set("cp.dcp", 0)))),
    Row("world-above-64-in-file", SCENARIO, "--allow-large", json_file(edited(_set("cp.dcp", 128)))),
    Row("request-negative", SCENARIO, "context_len: must be greater than or equal to 0", json_file(
        edited(_set("batch.requests[0].context_len", -5)))),
    Row("toml-misspelt-key", SCENARIO, "did you mean 'cp.interleave'", text_file(
        'interleve = 8\ngroups = [{name = "a"}]\n[batch]\nrequests = [{context_len = 0, num_tokens = 4}]\n', "t.toml")),
    Row("toml-cp-sharded-string", SCENARIO, "groups[0].cp_sharded: must be a valid boolean", text_file(
        'groups = [{name = "a", cp_sharded = "no"}]\n[batch]\nrequests = [{context_len = 0, num_tokens = 4}]\n',
        "t.toml")),
    Row("draw-repro-directory", ["draw", "--repro", "{f}", "--out", "{tmp}/p.png"], "is a directory",
        a_directory("r.json")),
    Row("repro-wrapper-bad-knob", SCENARIO, "did you mean 'virtual_from_kernel_block'", json_file(
        {"scenario": good(), "knobs": {"virtual_from_kernel_blocks": True}})),
    # -- CLI values --
    Row("seed-minus-one", ["run", "--seed", "-1"], "--seed: must be greater than or equal to 0"),
    Row("seed-not-int", ["run", "--seed", "1.5"], "invalid int value"),
    Row("timeout-zero", ["run", "--timeout", "0"], "--timeout: must be greater than 0"),
    Row("timeout-negative", ["run", "--timeout", "-5"], "--timeout: must be greater than 0"),
    Row("timeout-nan", ["run", "--timeout", "nan"], "--timeout: must be a finite number"),
    Row("timeout-inf", ["run", "--timeout", "inf"], "--timeout"),
    Row("dcp-zero", ["run", "--dcp", "0"], "--dcp: must be greater than or equal to 1"),
    Row("dcp-1000-needs-allow-large", ["run", "--dcp", "1000"], "pass --allow-large"),
    Row("dcp-beyond-bound", ["run", "--dcp", "100000", "--allow-large"], "--dcp: must be less than or equal to 1024"),
    Row("pcp-negative", ["run", "--pcp", "-2"], "--pcp"),
    Row("interleave-zero", ["run", "--interleave", "0"], "--interleave"),
    Row("inject-on-rank-negative", ["run", "--inject", "stale-tail", "--inject-on-rank", "-1"], "--inject-on-rank"),
    Row("unknown-option", ["run", "--dpc", "4"], "unrecognized arguments: --dpc"),
    Row("bad-choice", ["run", "--kernel-design", "tiles"], "invalid choice"),
    Row("unknown-path", ["run", "--paths", "v3"], "v3"),
    Row("matrix-jobs-negative", ["bugs", "matrix", "--jobs", "-1"], "--jobs"),
    # -- output paths, probed before any work --
    Row("json-is-directory", ["run", "--json", "{f}"], "--json: {tmp}/out is a directory", a_directory("out")),
    Row("json-missing-parent", ["run", "--json", "{tmp}/no/such/r.json"], "does not exist"),
    Row("json-parent-is-file", ["run", "--json", "{f}/r.json"], "is not a directory", text_file("x", "file")),
    Row("html-is-directory", ["run", "--html", "{f}"], "--html", a_directory("h")),
    Row("junit-missing-parent", ["run", "--junit", "{tmp}/no/r.xml"], "--junit"),
    Row("same-file-twice", ["run", "--json", "{tmp}/r", "--junit", "{tmp}/r"], "also given to --json"),
    Row("sweep-json-directory", ["sweep", "--json", "{f}"], "--json", a_directory("sj")),
    Row("replay-json-directory", ["replay", "{tmp}/r.json", "--json", "{f}"], "--json", a_directory("rj")),
    Row("draw-out-missing-dir", ["draw", "--out", "{tmp}/no/p.png"], "--out"),
    Row("bugs-show-dump-missing-dir", ["bugs", "show", "stale-tail", "--dump", "{tmp}/no/s.json"], "--dump"),
    # -- paths and kernels that cannot run --
    Row("kernel-v1-fused-at-cp8", ["run", "--kernel-v1-fused", CALLABLE], "--kernel-v1-fused: the v1-fused path "
                                                                          "runs at CP world size 1 only"),
    Row("kernel-v1-fused-with-paths", ["run", "--paths", "v1,v1-fused", "--kernel-v1-fused", CALLABLE],
        "--kernel-v1-fused"),
    Row("paths-v1-fused-at-cp8", ["run", "--paths", "v1-fused"], "--paths: the v1-fused path runs at CP world size 1"),
    Row("paths-with-v1-fused-at-cp4", ["run", "--scenario", str(EXAMPLE), "--paths", "v1,v1-fused"], "drop v1-fused"),
    Row("bugs-reproduce-v1-fused-at-cp2", ["bugs", "reproduce", "mamba-sized-per-cp", "--paths", "v1-fused"],
        "v1-fused"),
    Row("sweep-unknown-preset", ["sweep", "--presets", "default,nosuch"], "unknown preset 'nosuch'"),
    Row("sweep-misspelt-preset", ["sweep", "--presets", "mpt"], "did you mean 'mtp'"),
    Row("sweep-missing-file", ["sweep", "--presets", "{tmp}/gone.json"], "does not exist"),
    Row("sweep-bad-scenario-file", ["sweep", "--presets", "{f}"], "did you mean 'batch'",
        json_file(edited(_rename("batch", "bacth")))),
    Row("sweep-kernel-v1-fused-no-cp1-cell", ["sweep", "--cp", "2,4", "--kernel-v1-fused", CALLABLE],
        "--kernel-v1-fused"),
    Row("sweep-paths-v1-fused-no-cp1-cell", ["sweep", "--paths", "v1-fused"], "runs at CP world size 1 only"),
    Row("sweep-cp-beyond-bound", ["sweep", "--cp", "5000"], "must lie in [1, 1024]"),
    Row("sweep-config-unknown-key", ["sweep", "--config", "{f}"], "did you mean 'presets'",
        text_file('preset = ["default"]\n', "c.toml")),
    Row("sweep-config-seed-bool", ["sweep", "--config", "{f}"], "seed", text_file("seed = true\n", "c.toml")),
    Row("sweep-interleaves-zero", ["sweep", "--interleaves", "0"], "must lie in [1, 16777216]"),
    Row("sweep-config-seed-negative", ["sweep", "--config", "{f}"], "config.seed: must be greater than or equal to 0",
        text_file("seed = -4\n", "c.toml")),
    Row("sweep-config-directory", ["sweep", "--config", "{f}"], "is a directory", a_directory("c.toml")),
    # -- replay --
    Row("replay-directory", ["replay", "{f}"], "is a directory", a_directory("rdir")),
    Row("replay-missing", ["replay", "{tmp}/none.json"], "does not exist"),
    Row("replay-not-json", ["replay", "{f}"], "not valid JSON", text_file("{", "r.json")),
    Row("replay-json-list", ["replay", "{f}"], "must hold one JSON object", json_file([])),
    Row("replay-no-schema", ["replay", "{f}"], "not a cpsim repro file", json_file({"scenario": good()})),
    Row("replay-unknown-inject", ["replay", "{f}"], "repro.inject: unknown fault 'no-such-fault'",
        repro(_set("inject", "no-such-fault"))),
    Row("replay-wrong-schema", ["replay", "{f}"], "repro.schema", repro(_set("schema", "cpsim-repro/9"))),
    Row("replay-without-scenario", ["replay", "{f}"], "repro.scenario: is required", repro(lambda d: d.pop("scenario"))),
    Row("replay-scenario-wrong-type", ["replay", "{f}"], "repro.scenario: must be an object",
        repro(_set("scenario", [1]))),
    Row("replay-violation-wrong-type", ["replay", "{f}"], "repro.violation: must be an object",
        repro(_set("violation", "dense-local"))),
    Row("replay-violation-invariants-wrong-type", ["replay", "{f}"], "repro.violation.invariants",
        repro(_set("violation.invariants", "dense-local"))),
    Row("replay-edited-scenario", ["replay", "{f}"], "was edited", repro(_set("scenario.seed", 5))),
    Row("replay-no-fingerprint", ["replay", "{f}"], "repro.fingerprint", repro(lambda d: d.pop("fingerprint"))),
    Row("replay-bad-fingerprint", ["replay", "{f}"], "repro.fingerprint", repro(_set("fingerprint", "xyz"))),
    Row("replay-unknown-path", ["replay", "{f}"], "repro.paths[0]", repro(_set("paths", ["v3"]))),
    Row("replay-unknown-kernel-path", ["replay", "{f}"], "repro.kernels", repro(_set("kernels", {"v9": "builtin"}))),
    Row("replay-kernel-record-wrong-type", ["replay", "{f}"], "repro.kernels.v1", repro(_set("kernels.v1", 5))),
    Row("replay-knob-misspelt", ["replay", "{f}"], "did you mean 'draft_overwrite'",
        repro(_set("knobs.draft_overwrites", True))),
    Row("replay-knob-wrong-type", ["replay", "{f}"], "knobs.buffer_size", repro(_set("knobs.buffer_size", "8"))),
    Row("replay-unknown-top-key", ["replay", "{f}"], "did you mean 'violation'", repro(_set("violations", {}))),
    Row("replay-scenario-misspelt-key", ["replay", "{f}"], "repro.scenario.cp: unknown key 'interleve'",
        repro(_set("scenario.cp.interleve", 8))),
    # -- explicit batches (JSON: meta and arrays in one file) --
    Row("explicit-unknown-key", REPLAY, "explicit: unknown key 'pathh'; did you mean 'path'?",
        explicit(_set("pathh", "v1"))),
    Row("explicit-group-key-misspelt", REPLAY, "explicit.groups[0]: unknown key 'blocksize'; did you mean "
        "'block_size'?", explicit(lambda d: d["groups"][0].__setitem__("blocksize", d["groups"][0].pop("block_size")))),
    Row("explicit-rank-key-misspelt", REPLAY, "did you mean 'num_tokens_padded'?",
        explicit(_set("ranks[0].num_tokens_paded", 8))),
    Row("explicit-unknown-array", REPLAY, "explicit.arrays: unknown array 'positons'; did you mean 'positions'?",
        explicit(_set("arrays.positons", [0]))),
    Row("explicit-array-of-a-rank-not-there", REPLAY, "array 'r5/slots' names rank 5 but the CP world is 2",
        explicit(_set("arrays.r5/slots", [[0]]))),
    Row("explicit-format-misspelt", REPLAY, "explicit.format: must be one of cpsim-explicit, got 'cpsim-explict' "
        "(a string); did you mean 'cpsim-explicit'?", explicit(_set("format", "cpsim-explict"))),
    Row("explicit-version-2", REPLAY, "explicit.version: must be one of 1, got 2", explicit(_set("version", 2))),
    Row("explicit-dcp-bool", REPLAY, "explicit.cp.dcp: must be a valid integer, got true (a boolean)",
        explicit(_set("cp.dcp", True))),
    Row("explicit-padded-string", REPLAY, "explicit.ranks[0].num_tokens_padded: must be a valid integer, got '8'",
        explicit(_set("ranks[0].num_tokens_padded", "8"))),
    Row("explicit-padded-nan", REPLAY, "ranks[0].num_tokens_padded: NaN and infinity are not allowed",
        explicit(raw=lambda s: s.replace('"num_tokens_padded": 8', '"num_tokens_padded": NaN', 1))),
    Row("explicit-positions-bool", REPLAY, "explicit.arrays.positions[0]: must be a valid integer, got true",
        explicit(_set("arrays.positions", [True, 2, 7, 0, 3, 6, 1, 4]))),
    Row("explicit-positions-float", REPLAY, "explicit.arrays.positions[2]: must be a valid integer, got 7.5",
        explicit(_set("arrays.positions", [5, 2, 7.5, 0, 3, 6, 1, 4]))),
    Row("explicit-positions-negative", REPLAY, "ranks[0].positions: position -5 is negative, but group attn "
        "(attention) reads the step's positions", explicit(_set("arrays.positions", [5, 2, -5, 0, 3, 6, 1, 4]))),
    Row("explicit-positions-too-small", REPLAY, "ranks[0].positions: positions must lie in [-16777216, 16777216]",
        explicit(_set("arrays.positions", [5, 2, -2**25, 0, 3, 6, 1, 4]))),
    Row("explicit-group-positions-2d", REPLAY, "explicit.arrays.g0/positions[0]: must be a valid integer, got a list",
        explicit(_set("arrays.g0/positions", [[0, 1]]))),
    Row("explicit-group-req-indices-out-of-range", REPLAY, "ranks[0].g0(attn).req_indices: must give each of the "
        "2 tokens a request in [0, num_reqs = 1)", explicit(lambda d: d["arrays"].update(
            {"g0/positions": [0, 1], "g0/req_indices": [0, 3]}))),
    Row("explicit-replay-start-without-window", REPLAY, "ranks[0].replay_start: a replay start needs a replay "
        "window", explicit(_set("arrays.replay_start", [3]))),
    Row("explicit-slot-beyond-int64", REPLAY, "explicit.arrays.r0/slots[0][1]: must be less than or equal to",
        explicit(lambda d: d["arrays"]["r0/slots"][0].__setitem__(1, 2**64))),
    Row("explicit-table-ragged", REPLAY, "explicit.arrays.r0/g0/table: rows must have one length",
        explicit(_set("arrays.r0/g0/table", [[3, 5], [1]]))),
    Row("explicit-is-padding-2", REPLAY, "explicit.arrays.is_padding[1]: must be true/false or 0/1, got 2",
        explicit(_set("arrays.is_padding", [0, 2, 0, 0, 0, 0, 0, 0]))),
    Row("explicit-entry-size-negative", REPLAY, "explicit.groups[0].entry_size: must be greater than or equal to 1",
        explicit(_set("groups[0].entry_size", -4))),
    Row("explicit-max-model-len-huge", REPLAY, "explicit.limits.max_model_len: must be less than or equal to "
        "16777216, got 1000000000000000000: cpsim allocates", explicit(_set("limits.max_model_len", 10**18))),
    Row("explicit-arrays-as-list", REPLAY, "explicit.arrays: must be an object", explicit(_set("arrays", [1]))),
    Row("explicit-truncated", REPLAY, "not valid JSON", explicit(raw=lambda s: s[: len(s) // 2])),
    # -- explicit batches (.npz archive) --
    Row("explicit-npz-unknown-key", REPLAY, "explicit.limits: unknown key 'max_model_lenn'; did you mean "
        "'max_model_len'?", explicit_npz(lambda d: d["limits"].__setitem__("max_model_lenn", 16))),
    Row("explicit-npz-positions-bool", REPLAY, "explicit.arrays.positions: must hold integers, got booleans",
        explicit_npz(arrays={"positions": __import__("numpy").ones(8, dtype=bool)})),
    Row("explicit-npz-unknown-member", REPLAY, "unknown array 'r0/slot'; did you mean 'r0/slots'?",
        explicit_npz(arrays={"r0/slot": __import__("numpy").zeros((1, 10), dtype=__import__("numpy").int64)})),
    Row("explicit-npz-truncated", REPLAY, "is not a cpsim capture/batch archive", explicit_npz(cut=True)),
    Row("explicit-npz-binary", REPLAY, "is not a cpsim capture/batch archive", text_file(b"\x89PNG\r\n\x00", "b.npz")),
    # -- capture files (rank<R>.cpcap) --
    Row("capture-header-unknown-key", REPLAY, "capture: unknown key 'rnak'; did you mean 'rank'?",
        capture_file({"rnak": 1})),
    Row("capture-header-rank-bool", REPLAY, "capture.rank: must be a valid integer, got true (a boolean)",
        capture_file({"rank": True})),
    Row("capture-meta-misspelt", REPLAY, "capture.meta: unknown key 'max_model_length'; did you mean 'max_model_len'?",
        capture_file({"meta": {"max_model_length": 16}})),
    Row("capture-meta-nan", REPLAY, "capture.meta.max_model_len: must be a valid integer, got nan",
        capture_file({"meta": {"max_model_len": float("nan")}})),
    Row("capture-meta-num-blocks-bool", REPLAY, "capture.meta.num_blocks[0]: must be a valid integer, got true",
        capture_file({"meta": {"num_blocks": [True]}})),
    Row("capture-launch-family", REPLAY, "capture.family: must be one of v1, v2, v1-fused, host-v1, host-v2, unknown, got 'v3'",
        capture_file(launch={"family": "v3"})),
    Row("capture-launch-world-zero", REPLAY, "capture.scalars.TOTAL_CP_WORLD_SIZE: must be greater than or equal to 1",
        capture_file(scalars={"TOTAL_CP_WORLD_SIZE": 0})),
    Row("capture-launch-block-size-string", REPLAY, "capture.scalars.KV_CACHE_BLOCK_SIZE: must be a valid integer, "
        "got '4'", capture_file(scalars={"KV_CACHE_BLOCK_SIZE": "4"})),
    Row("capture-launch-block-size-missing", REPLAY, "capture.scalars.KV_CACHE_BLOCK_SIZE: is required",
        capture_file(scalars={"KV_CACHE_BLOCK_SIZE": None})),
    Row("capture-positions-float", REPLAY, "positions_ptr: must hold integers, got dtype float64",
        capture_file(arrays={"positions_ptr": __import__("numpy").arange(4.0)})),
    Row("capture-truncated", REPLAY, "is not a cpsim capture/batch archive",
        lambda tmp: (lambda p: (p.write_bytes(p.read_bytes()[:300]), p)[1])(capture_file()(tmp))),
    Row("capture-binary", REPLAY, "is not a cpsim capture/batch archive", capture_file(raw=b"\x7fELF\x02\x01\x00")),
]


# ---- paths the system cannot look up (issue 27, item 6): every file or directory flag of every command ----

def symlink_loop(tmp: Path, suffix: str = "") -> Path:
    (tmp / f"loop-a{suffix}").symlink_to(tmp / f"loop-b{suffix}")
    (tmp / f"loop-b{suffix}").symlink_to(tmp / f"loop-a{suffix}")
    return tmp / f"loop-a{suffix}"


# (the command line before the flag, the flag as the message names it, the flag on the command line)
PATH_FLAGS = [
    ("run", "--scenario"), ("run", "--json"), ("run", "--html"), ("run", "--junit"), ("run", "--kernel-v1"),
    ("run", "--kernel-v2"), ("run", "--kernel-v1-fused"), ("run", "--kernel-replay"), ("run", "--stack-python"),
    ("run", "--stack-classes"), ("run", "--stack-source"), ("run", "--sizing"), ("sweep", "--sizing"),
    ("fuzz", "--sizing"), ("bugs reproduce stale-tail", "--sizing"),
    ("sweep", "--config"), ("sweep", "--presets"), ("sweep", "--json"), ("sweep", "--html"), ("sweep", "--junit"),
    ("bugs matrix", "--json"), ("bugs show stale-tail", "--dump"), ("bugs reproduce stale-tail", "--json"),
    ("bugs reproduce stale-tail", "--html"), ("doctor", "--json"), ("draw", "--out"), ("draw --out x.png", "--repro"),
    ("draw --out x.png", "--capture"), ("fuzz", "--known"), ("fuzz", "--out"), ("fuzz", "--db"),
    ("replay", "FILE"), (f"replay {EXPLICIT}", "--shrink"), (f"replay {EXPLICIT}", "--json"),
    (f"replay {EXPLICIT}", "--html"), ("ascend-check", "--json"), ("ascend-check", "--ascend-python"),
]


def _path_argv(before: str, flag: str, value: str) -> list[str]:
    if flag.startswith("--kernel") or flag == "--sizing":
        value += ":kernel" if value == "{f}" else ".py:kernel"
    elif flag == "--presets":
        value = "mtp," + value
    return before.split() + ([value] if flag == "FILE" else [flag, value])


for _before, _flag in PATH_FLAGS:
    _cmd = _before.split()[0] + ("-" + _before.split()[1] if _before.startswith("bugs") else "")
    _name = _flag.lstrip("-").lower()
    ROWS.append(Row(f"path-5000-chars-{_cmd}-{_name}", _path_argv(_before, _flag, "a" * 5000),
                    f"{_flag}: path of 500"))
    ROWS.append(Row(f"path-256-char-name-{_cmd}-{_name}", _path_argv(_before, _flag, "d/" + "n" * 256),
                    f"{_flag}: a name of 25"))
    ROWS.append(Row(f"path-symlink-loop-{_cmd}-{_name}", _path_argv(_before, _flag, "{f}"),
                    f"{_flag}: {{tmp}}/loop-a", (lambda tmp: symlink_loop(tmp, ".py")) if _flag in ("--sizing",) or _flag.startswith("--kernel")
                    else symlink_loop))
ROWS += [
    Row("fuzz-known-not-signatures", ["fuzz", "--known", "{f}"], "line 1 ('dcp = 2') is not a signature",
        text_file("dcp = 2\n", "known.txt")),
    Row("fuzz-known-json-not-a-summary", ["fuzz", "--known", "{f}"], "--known: {tmp}/known.txt is not a fuzz summary",
        text_file('{"scenario": {}}', "known.txt")),
    Row("fuzz-known-json-signatures-not-a-list", ["fuzz", "--known", "{f}"], "is not a fuzz summary",
        json_file({"signatures": 5}, "known.json")),
    Row("fuzz-known-binary", ["fuzz", "--known", "{f}"], "--known: cannot read", text_file(b"\x89PNG\x00", "k.png")),
    Row("fuzz-db-regular-file", ["fuzz", "--db", "{f}"], "--db: {tmp}/db is not a directory",
        text_file("", "db")),
    Row("fuzz-db-under-a-file", ["fuzz", "--db", "{f}/sub"], "is not a directory ({tmp}/db is a file)",
        text_file("", "db")),
]


def test_every_path_flag_of_every_command_is_checked():
    """Walk the parser: every option that takes a file or directory is in cpsim.validate's table and
    has its rows above, so a flag added later cannot skip the path check unnoticed."""
    from cpsim.cli import build_parser
    from cpsim import validate
    import argparse
    checked = validate.PATH_OPTIONS | validate.LIST_PATH_OPTIONS | validate.SPEC_OPTIONS
    seen = set()

    def walk(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
                continue
            meta = str(action.metavar or "")
            if any(w in meta for w in ("FILE", "PATH", "DIR", "OUT", "PY", "SPEC")) or action.dest == "file":
                assert action.dest in checked, (parser.prog, action.option_strings or action.dest)
                seen.add(checked[action.dest])
    walk(build_parser())
    assert seen - {"--presets"} <= {flag for _, flag in PATH_FLAGS}, seen - {flag for _, flag in PATH_FLAGS}


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_row(row: Row, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = run_row(row, tmp_path)
    code = main(argv, runner=RUNNER)
    out, err = capsys.readouterr()
    assert code == row.code, (argv, out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err                                   # one line
    assert row.phrase.replace("{tmp}", str(tmp_path)) in lines[0], lines[0]


def test_table_covers_every_kind_of_row():
    """The table is the contract: keep it from shrinking unnoticed."""
    assert len(ROWS) >= 152
    assert len({r.id for r in ROWS}) == len(ROWS)


def test_the_capture_and_batch_rows_start_from_files_that_replay_clean(tmp_path, capsys):
    """Each capture / explicit-batch row breaks exactly one thing in a file that is otherwise good."""
    for i, make in enumerate((explicit(lambda d: None), explicit_npz(), capture_file())):
        d = tmp_path / str(i)
        d.mkdir()
        assert main(["replay", str(make(d)), "--quiet"], runner=RUNNER) == 0, capsys.readouterr()
    # ... and whose checks still bite: a wrong slot in the hand-made capture is a violation.
    d = tmp_path / "wrong"
    d.mkdir()
    import numpy as np
    assert main(["replay", str(capture_file(arrays={"slot_mapping_ptr": np.array([12, 13, 15, 14])})(d)),
                 "--quiet"], runner=RUNNER) == 1


@pytest.mark.parametrize("meta, phrase", [
    ('{"max_model_length": 8}', "CPSIM_CAPTURE_META: unknown key 'max_model_length'; did you mean 'max_model_len'?"),
    ('{"block_sizes": [16, true]}', "CPSIM_CAPTURE_META.block_sizes[1]: must be a valid integer, got true"),
    ('{"max_num_reqs": NaN}', "CPSIM_CAPTURE_META.max_num_reqs: must be a valid integer, got nan"),
    ('{"num_blocks": 1}', "CPSIM_CAPTURE_META.num_blocks: must be greater than or equal to 2"),
    ("[1]", "CPSIM_CAPTURE_META: must be an object"),
    ("{", "CPSIM_CAPTURE_META: not valid JSON"),
])
def test_capture_meta_from_the_environment_is_checked_before_recording(tmp_path, meta, phrase):
    from cpsim import capture
    with pytest.raises(ConfigError) as e:
        capture.install({"CPSIM_CAPTURE": str(tmp_path / "cap"), "CPSIM_CAPTURE_META": meta})
    assert phrase in str(e.value)
    assert capture.active() is None and not (tmp_path / "cap").exists()


def test_capture_meta_in_code_is_checked(tmp_path):
    from cpsim import capture
    with pytest.raises(ConfigError, match="meta: unknown key 'block_size'; did you mean 'block_sizes'"):
        with capture.capture(tmp_path / "cap", meta={"block_size": [16]}):
            pass
    with capture.capture(tmp_path / "ok", meta={"block_sizes": [16], "num_blocks": 64}) as rec:
        assert rec.meta == {"block_sizes": [16], "num_blocks": 64}


# ---- outputs: probe first, write all, report the failure ------------------------------------

def _unwritable_dir(tmp_path: Path) -> Path:
    """A directory no file can be created in, for root as for anyone."""
    if os.geteuid() == 0:
        if not Path("/sys").is_dir():
            pytest.skip("no read-only directory for root")
        return Path("/sys")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    return d


def test_unwritable_json_with_valid_html_junit_stops_before_work(tmp_path, capsys):
    ro = _unwritable_dir(tmp_path)
    html, junit = tmp_path / "r.html", tmp_path / "r.xml"
    code = main(["run", "--json", str(ro / "r.json"), "--html", str(html), "--junit", str(junit)], runner=RUNNER)
    err = capsys.readouterr().err
    assert code == 2 and "--json" in err and "cannot write" in err and "Traceback" not in err
    assert not html.exists() and not junit.exists()   # nothing computed, nothing half-written


def test_a_write_failing_at_the_end_leaves_the_other_outputs(tmp_path, capsys, monkeypatch):
    """Disk full (or the directory removed) during the run: JUnit and HTML are still written."""
    from cpsim.report import report

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "write_json", full)
    js, html, junit = tmp_path / "r.json", tmp_path / "r.html", tmp_path / "r.xml"
    code = main(["run", "--scenario", str(EXAMPLE), "--dcp", "1", "--paths", "v1-torch", "--quiet",
                 "--json", str(js), "--html", str(html), "--junit", str(junit)], runner=RUNNER)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "pass" in out                                           # the verdict was printed first
    assert "--json" in err and "No space left on device" in err and "--junit, --html written" in err
    assert "Traceback" not in out + err
    assert junit.read_text().startswith("<?xml") and "<html" in html.read_text().lower()
    assert not js.exists()


def test_the_probe_leaves_nothing_behind(tmp_path):
    from cpsim.validate import check_writable
    existing = tmp_path / "keep.json"
    existing.write_text("old")
    check_writable("--json", str(existing))
    check_writable("--json", str(tmp_path / "new.json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"] and existing.read_text() == "old"


# ---- replay: the fingerprint ------------------------------------------------------------------

def test_replay_runs_an_unedited_repro_and_an_edited_one_only_when_asked(tmp_path, capsys):
    path = repro()(tmp_path)
    assert main(["replay", str(path), "--quiet"], runner=RUNNER) == 0
    data = json.loads(path.read_text())
    data["scenario"]["batch"]["requests"][0]["kind"] = "renamed"   # a label: the violation status stays
    path.write_text(json.dumps(data))
    assert main(["replay", str(path), "--quiet"], runner=RUNNER) == 2
    assert "--accept-edited" in capsys.readouterr().err
    assert main(["replay", str(path), "--quiet", "--accept-edited"], runner=RUNNER) == 0


# ---- no traceback reaches the terminal --------------------------------------------------------

@pytest.mark.parametrize("argv, make", [
    (["run", "--scenario", "{f}"], json_file([1, 2])),
    (["run", "--seed", "-1"], None),
    (["replay", "{f}"], a_directory("d")),
    (["run", "--json", "{f}"], a_directory("o")),
    (["run", "--scenario", "{f}"], text_file(b"\x00\x01\x02", "b.json")),
], ids=["scenario-list", "seed-minus-one", "replay-directory", "json-directory", "binary-scenario"])
def test_terminal_gets_one_line_and_exit_2(argv, make, tmp_path):
    argv = run_row(Row("", argv, "", make), tmp_path)
    proc = subprocess.run([sys.executable, "-m", "cpsim", *argv], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "COLUMNS": "40"})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error:"), proc.stderr


# ---- the messages themselves -------------------------------------------------------------------

def test_error_names_the_file_field_and_rule(tmp_path):
    p = json_file(edited(_rename("interleave", "interleve", "cp")))(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_scenario(p)
    assert e.value.field == "scenario.cp"
    assert e.value.rule == f"unknown key 'interleve'; did you mean 'interleave'? (in {p})"


def test_union_alternatives_are_reported_together(tmp_path):
    from cpsim.cmd.replay import load_repro
    with pytest.raises(ConfigError) as e:
        load_repro(repro(_set("kernels", {"v1": 5}))(tmp_path))
    assert "repro.kernels.v1" in e.value.field
    assert "'builtin'" in e.value.rule and "a valid string" in e.value.rule and "got 5" in e.value.rule


def test_cp_sharded_false_is_false_and_true_is_true():
    assert sc.Scenario.from_dict(edited(_set("groups[0].cp_sharded", False))).groups[0].cp_sharded is False
    assert sc.Scenario.from_dict(edited(_set("groups[0].cp_sharded", True))).groups[0].cp_sharded is True


# ---- good input still passes ----------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "examples").glob("*.*") if p.suffix in (".json", ".toml")),
                         ids=lambda p: p.name)
def test_every_example_loads(path):
    from cpsim.capture import batch as xb
    if xb.is_explicit(path):  # an explicit batch (docs/CAPTURE.md), not a scenario file
        xb.load(path)
    else:
        sc.validate(load_scenario(path))


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_every_preset_round_trips_through_a_file(name, suffix, tmp_path):
    s = preset(name)
    s.dump(tmp_path / f"s{suffix}")
    back = load_scenario(tmp_path / f"s{suffix}")
    assert back == s and back.fingerprint() == s.fingerprint()


@pytest.mark.parametrize("seed", range(20))
def test_random_scenarios_round_trip(seed):
    s = random_scenario(seed)
    assert sc.Scenario.from_dict(json.loads(s.canonical_json())) == s


def test_defaults_are_filled_like_the_dataclasses():
    s = sc.Scenario.from_dict({"groups": [{"name": "a"}], "batch": {"requests": [{"context_len": 0, "num_tokens": 4}]}})
    assert s.cp == sc.CPConfig() and s.limits == sc.Limits() and s.groups[0] == sc.KVGroup("a")
    assert s.batch == sc.Batch((sc.Request(0, 4),)) and s.name == "custom" and s.seed == 0


@pytest.mark.parametrize("model, cls", [
    (schema.CPConfigModel, sc.CPConfig), (schema.KVGroupModel, sc.KVGroup), (schema.LimitsModel, sc.Limits),
    (schema.RequestModel, sc.Request), (schema.BatchModel, sc.Batch), (schema.ScenarioModel, sc.Scenario),
], ids=lambda x: x.__name__)
def test_models_match_the_dataclasses(model, cls):
    """A field added to a dataclass must be added to its model (else files holding it are refused)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert set(model.model_fields) == set(fields)
    for name, f in fields.items():
        if f.default is not dataclasses.MISSING:
            default = model.model_fields[name].default
            assert default == f.default or (f.default == () and default == []), name


def test_knobs_model_matches_knobs():
    from cpsim.paths import Knobs
    fields = {f.name: f.default for f in dataclasses.fields(Knobs)}
    model = {k: v.default for k, v in schema.KnobsModel.model_fields.items()}
    assert model.keys() == fields.keys()
    assert all(model[k] == v or (v == () and model[k] == []) for k, v in fields.items())  # a tuple reads back as a list


def test_good_cli_values_still_parse(tmp_path, capsys):
    """Bounds are not off by one: the edges of each range are accepted."""
    from cpsim.cli import build_parser
    from cpsim.validate import check_args
    args = build_parser().parse_args(["run", "--seed", "0", "--timeout", "0.5", "--dcp", "64", "--pcp", "1",
                                      "--interleave", "1", "--json", str(tmp_path / "r.json")])
    check_args(args)
    args = build_parser().parse_args(["run", "--dcp", "1024", "--allow-large"])
    check_args(args)
    assert not list(tmp_path.iterdir())

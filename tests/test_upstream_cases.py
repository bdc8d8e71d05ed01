"""Upstream's own test cases of block tables and slot mapping under (D)CP, judged by cpsim's oracle.

Each case takes the numbers of one upstream test (file, test and release named in its docstring:
vLLM 0.33.0's and 0.34.0's sdists, vllm-ascend 0.23.0.post1's sdist) and its expected slots or widths, written as an
explicit batch (docs/CAPTURE.md §3) judged under the release's profile, or as a call of cpsim's
release sizing (``cpsim.sizing``). The oracle must pass where the upstream test passes, and a twin
that breaks the upstream expectation must fail, so no case passes vacuously. Where the upstream
test leaves a number open (``max_model_len`` where it builds a table directly), the case uses the
length for which the release's runner would build that table, and says so. vLLM 0.34.0 ships the
0.33.0 MRV2 cases below unchanged (test_gpu_block_table.py drops only its v1 test; the kpool test
imports ``get_block_table_width`` from ``kv_cache_interface``), judged under the same profile.
vllm-ascend's a2/test_block_table.py works its expected slots out in the test (``compute_slot_mapping``
is patched out); the numbers are still upstream's statement of the layout.

One disagreement, where the release's code decides (cpsim is right): vLLM 0.33.0's kpool-tail test
builds its MLA table ``MAX_MODEL_LEN // 640 = 1638`` entries wide, one short of the
``cdiv(max_model_len, 640) = 1639`` its runner builds (``gpu/model_runner.py``:
``spec.max_num_blocks_per_req`` is ``cdiv(max_len, B)``, ``get_block_table_width`` keeps it); the
test reads positions below 21 only, so it never notices; ``block-sizing`` reports the short row.
Groups whose slot mapping the release disables (``uses_slot_mapping`` false: ``CircularBufferSpec``,
one-entry rows) are written as cpsim rings and pass ``block-sizing`` with their one entry.
Read from the release's code beside its tests: vllm-ascend 0.23.0.post1 sizes a compressed group
(``compress_ratio`` r) ``max(cdiv(W, r), 1)`` entries and maps it on positions ``total // r``; ``block-sizing``
wanted W of it, a false alarm on rows the release never reads, now judged by the group's
``compress_ratio`` (the compressed_group cases below).

Upstream cases cpsim cannot express (one line each, why):
- vLLM 0.33.0 tests/v1/worker/test_gpu_block_table.py::test_larger_draft_batch_uses_null_kpool_slots:
  ``compute_kpool_tail_slot_mapping`` is the kpool backend's own ring kernel, not a slot-mapping ABI.
- vLLM 0.33.0 test_gpu_block_table.py and 0.34.0 cpu/test_cpu_block_table.py (staged writes, row
  moves and capacity, gathers, dummy tables, sliding-window nulling, shared rows): table bookkeeping,
  no slots or widths to judge.
- vLLM 0.33.0 tests/v1/attention/test_kpool_tail_slot_mapping.py: the circular ring mapping of the
  tail backend (``CircularBufferSpec`` takes no slot mapping in the runner; cpsim's ring rule is its own).
- vLLM 0.33.0 tests/v1/attention/test_indexer_deepseek_v4_slot_mapping.py: the indexer's compressed
  mapping through attention metadata builders (state positions per rank); no block-table launch.
- vLLM 0.33.0 test_gpu_model_runner_v2.py::test_initialize_kv_cache_does_not_dcp_shard_mamba_block_table
  [no-prefix-cache-with-speculation]: cpsim's sizing models align mode only (``cdiv(mml, B) + spec``);
  the width 8 it captures is accepted by ``block-sizing`` (``test_mamba_spec_width_passes``) but not produced.
- vLLM 0.33.0 test_gpu_model_runner.py::test_input_batch_reinitialized_after_late_interleave_adjustment,
  ::test_v2_runner_snapshots_late_interleave_adjustment, test_gpu_input_batch_v2.py::test_prepare_dcp_local_
  seq_lens_uses_shared_buffer: runner plumbing (the interleave and DCP arguments forwarded), no slots.
- vLLM 0.33.0 tests/v1/attention/test_mamba_align_block_table.py, tests/kernels/test_compressor_kv_cache.py:
  the mamba backend's state-row gather and the DSV4 compressor's own cache writes, not the slot-mapping ABI.
- vllm-ascend 0.23.0.post1 test_block_table_310p.py::test_compute_slot_mapping_rejects_device_tensor_inputs:
  an argument-type check of the 310P host, no slots.
- vllm-ascend 0.23.0.post1 tests/e2e/.../triton/test_compute_slot_mapping.py: compares the NPU kernel with
  vLLM's on random tables (no expected values), and needs an NPU.
- vllm-ascend tests/ut/worker/test_compressor_tail_block_table.py (in the code index at commit cf26a4d,
  in no commit of vllm-project/vllm-ascend's mirrored history to 2026-08-22, so in no release): its tail
  group is a ring to cpsim; its normal group (4 entries of B 128 at max_model_len 4096) no runner builds.
"""

from __future__ import annotations

import copy
import json

import pytest

from cpsim import scenario as sc
from cpsim import sizing
from cpsim.capture import batch as xb
from cpsim.check import explicit, profiles
from cpsim.errors import ConfigError

P = -1


def _doc(path, groups, limits, arrays, cp=None):
    return {"format": "cpsim-explicit", "version": 1, "path": path, "cp": cp or {}, "groups": groups,
            "limits": limits, "arrays": arrays}


def _failed(doc, tmp_path, profile: str) -> dict[str, list[str]]:
    """{invariant: its violation messages} for every failing verdict under ``profile``."""
    f = tmp_path / "batch.json"
    f.write_text(json.dumps(doc))
    _, _, verdicts = explicit.check(xb.load(f), profile=profiles.get(profile))
    return {v.invariant: [x.message for x in v.violations] for v in verdicts if v.status == "fail"}


def _twin(doc, **arrays):
    out = copy.deepcopy(doc)
    out["arrays"].update(arrays)
    return out


# ---- vLLM 0.33.0 MRV2 (gpu/block_table.py BlockTables.compute_slot_mappings), profile vllm-0.33 ------

QSA_B = 262144


def custom_slot_mapping_groups():
    """vLLM 0.33.0 tests/v1/worker/test_gpu_block_table.py::test_block_tables_skip_custom_slot_mapping_groups.

    Two groups of one entry per row: B 8 with ``slot_mapping_enabled`` false (the runner's
    ``CircularBufferSpec``: a ring to cpsim) and B 262144 enabled; row 0 holds [7] and [12]; one
    request at positions 153797, 165757. Upstream expects PAD in the first group and 12 x 262144 + p
    in the second. max_model_len 262144: test_gpu_model_runner_v2.py::test_qsa_circular_group_uses_custom
    _slot_mapping's runner, which builds these two widths."""
    groups = [{"name": "raw", "kind": "sliding_window", "block_size": 8, "num_blocks": 16, "entry_size": 8},
              {"name": "compressed", "block_size": QSA_B, "num_blocks": 16, "entry_size": QSA_B}]
    return _doc("v2", groups, {"max_model_len": QSA_B, "max_num_reqs": 1, "max_num_batched_tokens": 4},
                {"positions": [153797, 165757], "query_start_loc": [0, 2], "idx_mapping": [0],
                 "r0/g0/table": [[7]], "r0/g1/table": [[12]],
                 "r0/slots": [[P] * 4, [12 * QSA_B + 153797, 12 * QSA_B + 165757, P, P]]})


def test_custom_slot_mapping_groups_agree(tmp_path):
    assert _failed(custom_slot_mapping_groups(), tmp_path, "vllm-0.33") == {}


def test_custom_slot_mapping_group_given_slots_fails(tmp_path):
    """The disabled group mapped through its one entry (7 x 8 + p % 8) is what the release never does."""
    doc = custom_slot_mapping_groups()
    bad = _twin(doc, **{"r0/slots": [[7 * 8 + 5, 7 * 8 + 5, P, P], doc["arrays"]["r0/slots"][1]]})
    assert "matches-reference" in _failed(bad, tmp_path, "vllm-0.33")


def dcp_sharded_and_replicated():
    """vLLM 0.33.0 test_gpu_block_table.py::test_dcp_slot_mapping_only_shards_sharded_groups, every cp_rank.

    DCP 4, interleave 128, B 128 for both groups; group 0 ``dcp_sharded`` (row [5, 9], width 2),
    group 1 not (rows 10..17, width 8); one request at positions 0..1023. Upstream expects, on rank r,
    group 0: positions r x 128 .. + 127 at 5 x 128 + offset and 512 + r x 128 .. at 9 x 128 + offset,
    PAD elsewhere; group 1: p + 10 x 128 on every rank. max_model_len 1024: the widths 2 and 8 are
    the runner's cdiv(1024, 128 x 4) and cdiv(1024, 128)."""
    groups = [{"name": "sharded", "block_size": 128, "num_blocks": 32, "entry_size": 128},
              {"name": "replicated", "block_size": 128, "num_blocks": 32, "cp_size": 1, "entry_size": 128}]
    arrays = {"positions": list(range(1024)), "query_start_loc": [0, 1024], "idx_mapping": [0]}
    for r in range(4):
        first = [P] * 1024
        for k in range(128):
            first[r * 128 + k] = 5 * 128 + k
            first[512 + r * 128 + k] = 9 * 128 + k
        arrays[f"r{r}/g0/table"] = [[5, 9]]
        arrays[f"r{r}/g1/table"] = [list(range(10, 18))]
        arrays[f"r{r}/slots"] = [first, [p + 10 * 128 for p in range(1024)]]
    return _doc("v2", groups, {"max_model_len": 1024, "max_num_reqs": 1, "max_num_batched_tokens": 1024},
                arrays, cp={"dcp": 4, "interleave": 128})


def test_dcp_sharded_and_replicated_groups_agree(tmp_path):
    assert _failed(dcp_sharded_and_replicated(), tmp_path, "vllm-0.33") == {}


def test_replicated_group_sharded_like_its_neighbour_fails(tmp_path):
    """Rank 1 applying the DCP transform to the replicated group too (the shape of vLLM #57260): its
    positions 128..255 and 640..767 at local offsets 0..255 of blocks 10, 11, PAD elsewhere."""
    doc = dcp_sharded_and_replicated()
    wrong = [P] * 1024
    for k in range(128):
        wrong[128 + k], wrong[640 + k] = 10 * 128 + k, 11 * 128 + k
    bad = _twin(doc, **{"r1/slots": [doc["arrays"]["r1/slots"][0], wrong]})
    assert {"exactly-one-owner", "matches-reference"} <= set(_failed(bad, tmp_path, "vllm-0.33"))


def dummy_request(idx: int):
    """vLLM 0.33.0 test_gpu_block_table.py::test_dummy_request_slot_mapping_is_pad.

    B 4, two rows of width 4, row 0 holds [7, 8]; one request at positions 1, 2, 3. Through
    ``idx_mapping`` [0] upstream expects 29, 30, 31; through [-1] (a dummy) PAD. max_model_len 16: the
    runner's cdiv(16, 4) = 4 entries. vLLM 0.34.0 cpu/test_cpu_block_table.py has the same case and
    numbers for CPUBlockTables."""
    slots = [29, 30, 31] if idx == 0 else [P] * 3
    return _doc("v2", [{"name": "attn", "block_size": 4, "num_blocks": 16, "entry_size": 4}],
                {"max_model_len": 16, "max_num_reqs": 2, "max_num_batched_tokens": 16},
                {"positions": [1, 2, 3], "query_start_loc": [0, 3], "idx_mapping": [idx],
                 "r0/g0/table": [[7, 8, 0, 0], [0] * 4], "r0/g0/num_blocks": [2, 0],
                 "r0/slots": [slots + [P] * 13]})


@pytest.mark.parametrize("idx", [0, -1])
def test_dummy_request_agrees(tmp_path, idx):
    assert _failed(dummy_request(idx), tmp_path, "vllm-0.33") == {}


def test_dummy_request_reading_row_0_fails(tmp_path):
    bad = _twin(dummy_request(-1), **{"r0/slots": [[29, 30, 31] + [P] * 13]})
    assert "padding" in _failed(bad, tmp_path, "vllm-0.33")


KPOOL_MML, MLA_B = 1 << 20, 640


def kpool_tail(mla_width: int):
    """vLLM 0.33.0 tests/v1/worker/test_gpu_kpool_tail_slot_mapping.py::test_kpool_tail_group_never_
    position_indexes_its_block_table.

    max_model_len 2^20; an MLA group of B 640 whose row 0 holds blocks 1..width, row 1 [2]; a kpool
    tail ``CircularBufferSpec`` of B 4 (``uses_slot_mapping`` false, width 1: a ring to cpsim) whose
    row 0 holds [7] and row 1 the poison id 2^20; 4 rows. One request at positions 0, 3, 4, 20.
    Upstream expects PAD in the tail group and blocks[p // 640] x 640 + p % 640 = 640 + p in the MLA
    group. The test builds the MLA row ``MAX_MODEL_LEN // 640`` = 1638 entries wide."""
    rows = [list(range(1, mla_width + 1)), [2] + [0] * (mla_width - 1), [0] * mla_width, [0] * mla_width]
    groups = [{"name": "mla", "block_size": MLA_B, "num_blocks": mla_width + 1, "entry_size": MLA_B},
              {"name": "tail", "kind": "sliding_window", "block_size": 4, "num_blocks": (1 << 20) + 1,
               "entry_size": 4}]
    return _doc("v2", groups, {"max_model_len": KPOOL_MML, "max_num_reqs": 4, "max_num_batched_tokens": 4},
                {"positions": [0, 3, 4, 20], "query_start_loc": [0, 4], "idx_mapping": [0],
                 "r0/g0/table": rows, "r0/g1/table": [[7], [1 << 20], [0], [0]],
                 "r0/g0/num_blocks": [mla_width, 1, 0, 0], "r0/g1/num_blocks": [1, 1, 0, 0],
                 "r0/slots": [[640, 643, 644, 660], [P] * 4]})


def test_kpool_tail_slots_agree_and_the_short_mla_row_is_reported(tmp_path):
    """The slots agree. The fixture's MLA row is one entry short of max_model_len: the release's runner
    builds cdiv(2^20, 640) = 1639 (the vllm-0.33 sizing says so too); block-sizing reports the 1638."""
    assert sizing.vllm_0_33_width({"host": "v2", "max_model_len": KPOOL_MML, "num_speculative_tokens": 0,
                                   "dcp_world_size": 1}, {"kind": "attention", "block_size": MLA_B,
                                                          "cp_sharded": False}) == 1639
    assert _failed(kpool_tail(KPOOL_MML // MLA_B), tmp_path, "vllm-0.33") == {
        "block-sizing": ["rank 0: table width 1638 < 1639 entries needed for positions < max_model_len "
                         "1048576 (block out of range)"]}
    assert _failed(kpool_tail(1639), tmp_path, "vllm-0.33") == {}


def test_kpool_tail_read_through_its_row_fails(tmp_path):
    """The pre-fix kernel: the tail group mapped by position; p = 4, 20 read past the one-entry row into
    row 1's poison id (2^20 x 4 + p % 4)."""
    bad = _twin(kpool_tail(1639), **{"r0/slots": [[640, 643, 644, 660], [28, 31, (1 << 22), (1 << 22)]]})
    assert "matches-reference" in _failed(bad, tmp_path, "vllm-0.33")


# ---- vLLM 0.33.0 widths (get_block_table_width, the runners' max_num_blocks), cpsim.sizing ---------

def _host(host, mml, groups, dcp=1, nst=0):
    return {"host": host, "max_model_len": mml, "max_num_reqs": 1, "max_num_batched_tokens": 1,
            "num_speculative_tokens": nst, "dcp_world_size": dcp, "pcp_world_size": 1,
            "cp_kv_cache_interleave_size": 1, "groups": groups}


def _g(kind, B, cp_sharded=False):
    return {"name": kind, "kind": kind, "block_size": B, "kernel_block_size": B, "cp_size": 1,
            "cp_sharded": cp_sharded}


def test_get_block_table_width_aligns_to_128_tokens():
    """vLLM 0.33.0 tests/v1/worker/test_gpu_model_runner.py::test_get_block_table_width_aligns_to_128_tokens:
    get_block_table_width(1875, 64) == 1876."""
    assert sizing.block_table_width(1875, 64) == 1876
    assert profiles.aligned_width(1875, 64) == 1876


def test_mamba_state_table_width_is_not_aligned():
    """vLLM 0.33.0 test_gpu_model_runner.py::test_mamba_state_table_width_is_not_aligned: v1
    MultiGroupBlockTable, a SlotMappingMode.NONE group of B 39664 and 1 block keeps width 1 (aligned it
    would be 8). max_model_len 39664: the runner's one block."""
    h = _host("v1", 39664, [_g("mamba", 39664)])
    assert sizing.vllm_0_33(h)["table_widths"] == [1]


def test_qsa_circular_group_widths():
    """vLLM 0.33.0 tests/v1/worker/test_gpu_model_runner_v2.py::test_qsa_circular_group_uses_custom_slot_mapping:
    max_model_len 262144, DCP 1, a CircularBufferSpec of B 8 and a FullAttentionSpec of B 262144; the
    MRV2 runner hands BlockTables max_num_blocks_per_group [1, 1], slot_mapping_enabled [False, True]."""
    h = _host("v2", QSA_B, [_g("circular", 8), _g("attention", QSA_B)])
    assert sizing.vllm_0_33(h)["table_widths"] == [1, 1]


def test_mamba_block_table_not_dcp_sharded_widths():
    """vLLM 0.33.0 test_gpu_model_runner_v2.py::test_initialize_kv_cache_does_not_dcp_shard_mamba_block_table
    [align-prefix-cache]: max_model_len 2^20, DCP 8, attention B 1536, mamba B 16 in align mode without
    speculation: the widths it captures before get_block_table_width, [86, 65536] (86 = cdiv(2^20, 1536 x 8);
    the state is not divided by DCP), which the alignment leaves as they are (128 / gcd(128, 1536) = 1)."""
    h = _host("v2", 1 << 20, [_g("attention", 1536, cp_sharded=True), _g("mamba", 16)], dcp=8)
    assert sizing.vllm_0_33(h)["table_widths"] == [86, 65536]


def mamba_state_table(width: int):
    """The same test [no-prefix-cache-with-speculation]: mamba B 16, DCP 8, 7 speculative blocks outside
    align mode: the runner sizes the state table 1 + 7 = 8 entries, not divided by DCP. One decode at
    position 0 of a request whose state block is 3 (slot 48 on every rank: MRV2 0.33.0 maps a
    ``MambaSpec`` group, ``uses_slot_mapping`` true, unsharded)."""
    arrays = {"positions": [0], "query_start_loc": [0, 1], "idx_mapping": [0]}
    for r in range(8):
        arrays[f"r{r}/g0/table"] = [[3] + [0] * (width - 1)]
        arrays[f"r{r}/g0/num_blocks"] = [1]
        arrays[f"r{r}/slots"] = [[48, P]]
    return _doc("v2", [{"name": "kda", "kind": "mamba", "block_size": 16, "num_blocks": 8, "entry_size": 16}],
                {"max_model_len": 1 << 20, "max_num_reqs": 1, "max_num_batched_tokens": 2,
                 "num_speculative_tokens": 7}, arrays, cp={"dcp": 8})


def test_mamba_spec_width_passes(tmp_path):
    assert _failed(mamba_state_table(8), tmp_path, "vllm-0.33") == {}


def test_mamba_state_table_divided_by_dcp_fails_block_sizing(tmp_path):
    """A state table narrower than 1 + speculative blocks (here 1 entry) is short of what it must hold."""
    assert set(_failed(mamba_state_table(1), tmp_path, "vllm-0.33")) == {"block-sizing"}


# ---- vllm-ascend 0.23.0.post1 tests/ut/worker/a2/test_block_table.py (v1 BlockTable; the same file at the
# v0.23.0 tag), profile vllm-ascend-0.23

ASCEND_B, ASCEND_WIDTH = 128, 128


def ascend_batch(dcp: int, pcp: int, interleave: int, req_indices: list[int], positions: list[int],
                 expected: dict[int, list[int]]):
    """TestBlockTableComputeSlotMapping's setup: B 128 (kernel size 128), 4 rows of 128 entries, request
    i holding blocks [4i .. 4i + 3] on every rank, 512 batched tokens. ``expected[rank]`` (rank = PCP
    rank x DCP + DCP rank) is the test's per-rank slot list. max_model_len 128 x 128 x CP: the length for
    which vllm-ascend's runner hands BlockTable 128 entries (cdiv(max_model_len, B x PCP x DCP)). Blocks
    0 and up are live (``num_blocks`` 4 per request): the test maps block id 0 like any other."""
    world = dcp * pcp
    nreq = max(req_indices) + 1
    qsl = [0] + [sum(1 for i in req_indices if i <= r) for r in range(nreq)]
    rows = [list(range(4 * i, 4 * i + 4)) + [0] * (ASCEND_WIDTH - 4) if i < nreq else [0] * ASCEND_WIDTH
            for i in range(4)]
    arrays = {"positions": positions, "query_start_loc": qsl}
    for r in range(world):
        arrays[f"r{r}/g0/table"] = rows
        arrays[f"r{r}/g0/num_blocks"] = [4 if i < nreq else 0 for i in range(4)]
        arrays[f"r{r}/slots"] = [expected[r] + [P] * (528 - len(positions))]
    return _doc("v1", [{"name": "attn", "block_size": ASCEND_B, "num_blocks": 16, "entry_size": ASCEND_B}],
                {"max_model_len": ASCEND_B * ASCEND_WIDTH * world, "max_num_reqs": 4,
                 "max_num_batched_tokens": 512}, arrays, cp={"dcp": dcp, "pcp": pcp, "interleave": interleave})


def ascend_dcp1_pcp1():
    """test_compute_slot_mapping_dcp1_pcp1_interleave1: requests 0, 0, 1, 1 at positions 0, 1, 0, 1
    expect [0, 1, 512, 513]. tests/ut/_310p/test_block_table_310p.py's ..._query_start_loc_signature and
    ..._accepts_none_compressed_args run the 310P kernel on the same numbers."""
    return ascend_batch(1, 1, 1, [0, 0, 1, 1], [0, 1, 0, 1], {0: [0, 1, 512, 513]})


def ascend_dcp4_pcp2_interleave1():
    """test_compute_slot_mapping_dcp4_pcp2_interleave1: request 0 at positions 0..15; rank k holds k
    and 8 + k at slots 0 and 1, PAD elsewhere. test_block_table_310p.py::test_compute_slot_mapping_with_
    req_indices_signature runs the 310P kernel on rank 0 of it."""
    expected = {}
    for k in range(8):
        row = [P] * 16
        row[k], row[8 + k] = 0, 1
        expected[k] = row
    return ascend_batch(4, 2, 1, [0] * 16, list(range(16)), expected)


def ascend_dcp4_pcp2_interleave128():
    """test_compute_slot_mapping_dcp4_pcp2_interleave128: request 0 at positions 0..129; rank 0 holds
    0..127 at slots 0..127, rank 1 holds 128, 129 at 0, 1, the others nothing."""
    expected = {k: [P] * 130 for k in range(8)}
    expected[0] = list(range(128)) + [P, P]
    expected[1] = [P] * 128 + [0, 1]
    return ascend_batch(4, 2, 128, [0] * 130, list(range(130)), expected)


ASCEND_CASES = {"dcp1_pcp1_interleave1": ascend_dcp1_pcp1, "dcp4_pcp2_interleave1": ascend_dcp4_pcp2_interleave1,
                "dcp4_pcp2_interleave128": ascend_dcp4_pcp2_interleave128}


@pytest.mark.parametrize("case", sorted(ASCEND_CASES))
def test_ascend_slot_mapping_agrees(tmp_path, case):
    assert _failed(ASCEND_CASES[case](), tmp_path, "vllm-ascend-0.23") == {}


def test_ascend_rank_holding_its_neighbours_token_fails(tmp_path):
    """Rank 0 also writing position 1 (rank 1's) at its slot 0 + 1."""
    doc = ascend_dcp4_pcp2_interleave1()
    row = list(doc["arrays"]["r0/slots"][0])
    row[1] = 2
    assert {"exactly-one-owner"} <= set(_failed(_twin(doc, **{"r0/slots": [row]}), tmp_path, "vllm-ascend-0.23"))


def test_ascend_draft_reserve_buffer():
    """tests/ut/worker/a2/test_block_table.py::test_compute_slot_mapping_draft_reserves_mtp_slots: DCP 4,
    PCP 1, 12 requests, 80 batched tokens, MTP 5: the slot buffer holds 152 entries (80 + 2 x 1 x 12 +
    4 x 12), of which the draft step's 110 tokens use the first 110."""
    h = _host("v1", 4096, [_g("attention", 128, cp_sharded=True)], dcp=4, nst=5)
    h["max_num_reqs"], h["max_num_batched_tokens"] = 12, 80
    assert sizing.vllm_ascend_0_23(h)["slot_buffer_len"] == 152


# ---- vLLM 0.34.0 tests/v1/worker/cpu/test_cpu_block_table.py (CPUBlockTables, MRV2 on CPU), vllm-0.33 ----

def cpu_block_tables():
    """vLLM 0.34.0 tests/v1/worker/cpu/test_cpu_block_table.py::test_compute_slot_mappings_cpu.

    Two groups of B 8 and width 3: group 0 enabled (row 0 [2, 3, 4], row 1 [10, 11, 12]), group 1 with
    ``slot_mapping_enabled`` false (a ring to cpsim; its rows are never filled). ``idx_mapping``
    [1, -1, 0], query_start_loc [0, 2, 4, 6], positions 0, 4 | 100, 101 (a dummy request) | 3, 8,
    an 8-entry buffer. Upstream expects group 0 [80, 84, -1, -1, 19, 24, -1] and PAD past it, group 1
    PAD everywhere. max_model_len 24: three blocks of 8, the rows' width. Its num_tokens_padded 7 is past
    the 6 positions the call hands over; an explicit batch gives positions for padded tokens too, so
    the count is left out: every entry past the 6 scheduled is PAD either way."""
    groups = [{"name": "attn", "block_size": 8, "num_blocks": 16, "entry_size": 8},
              {"name": "disabled", "kind": "sliding_window", "block_size": 8, "num_blocks": 16, "entry_size": 8}]
    return _doc("v2", groups, {"max_model_len": 24, "max_num_reqs": 2, "max_num_batched_tokens": 8},
                {"positions": [0, 4, 100, 101, 3, 8], "query_start_loc": [0, 2, 4, 6],
                 "idx_mapping": [1, -1, 0],
                 "r0/g0/table": [[2, 3, 4], [10, 11, 12]], "r0/g1/table": [[0, 0, 0], [0, 0, 0]],
                 "r0/g0/num_blocks": [2, 1], "r0/g1/num_blocks": [0, 0],
                 "r0/slots": [[80, 84, P, P, 19, 24, P, P], [P] * 8]})


def test_cpu_block_tables_agree(tmp_path):
    assert _failed(cpu_block_tables(), tmp_path, "vllm-0.33") == {}


def test_cpu_block_tables_disabled_group_mapped_fails(tmp_path):
    """The disabled group mapped like the enabled one: its rows hold no blocks, so 0 x 8 + p % 8."""
    bad = _twin(cpu_block_tables(), **{"r0/slots": [[80, 84, P, P, 19, 24, P, P], [0, 4, P, P, 3, 0, P, P]]})
    assert "matches-reference" in _failed(bad, tmp_path, "vllm-0.33")


# ---- vllm-ascend 0.23.0.post1 tests/ut/_310p/ (the 310P host: vllm_ascend/_310p/block_table.py) -------

def ascend_310p_compressed_inputs():
    """vllm-ascend 0.23.0.post1 tests/ut/_310p/test_block_table_310p.py::test_multi_group_compute_slot_mapping_
    uses_compressed_inputs_per_group (the kernel runs here, nothing patched).

    CP 1, two groups of B 128 and 128 entries (max_model_len 128 x 128, as the test passes), each with
    rows [0..3] and [4..7]; step positions 0, 1, 0, 1 of two requests. Group 0 is given its own
    positions [0, 1] of request 0, group 1 its own [0] of request 1. Upstream expects [0, 1] and [512]."""
    rows = [[0, 1, 2, 3] + [0] * 124, [4, 5, 6, 7] + [0] * 124, [0] * 128, [0] * 128]
    groups = [{"name": f"g{i}", "block_size": 128, "num_blocks": 16, "entry_size": 128} for i in range(2)]
    return _doc("v1", groups, {"max_model_len": 128 * 128, "max_num_reqs": 4, "max_num_batched_tokens": 512},
                {"positions": [0, 1, 0, 1], "query_start_loc": [0, 2, 4],
                 "g0/positions": [0, 1], "g0/req_indices": [0, 0], "g1/positions": [0], "g1/req_indices": [1],
                 "r0/g0/table": rows, "r0/g1/table": rows,
                 "r0/g0/num_blocks": [4, 4, 0, 0], "r0/g1/num_blocks": [4, 4, 0, 0],
                 "r0/slots": [[0, 1] + [P] * 526, [512] + [P] * 527]})


def test_ascend_310p_compressed_inputs_agree(tmp_path):
    assert _failed(ascend_310p_compressed_inputs(), tmp_path, "vllm-ascend-0.23") == {}


def test_ascend_310p_group_mapped_on_step_positions_fails(tmp_path):
    """Group 1 mapped on the step's positions instead of its own: 0, 1, 512, 513."""
    bad = _twin(ascend_310p_compressed_inputs(), **{"r0/slots": [[0, 1] + [P] * 526, [0, 1, 512, 513] + [P] * 524]})
    assert "matches-reference" in _failed(bad, tmp_path, "vllm-ascend-0.23")


def test_ascend_310p_mamba_widths():
    """vllm-ascend 0.23.0.post1 tests/ut/_310p/test_model_runner_310p.py::test_may_reinitialize_input_batch_
    expands_prefix_mamba_block_table: max_model_len 512, CP 1, attention B 128 and mamba B 128 in align
    mode with 2 speculative blocks: max_num_blocks_per_req [4, 6] (cpsim takes the speculative blocks
    from num_speculative_tokens)."""
    h = _host("v1", 512, [_g("attention", 128), _g("mamba", 128)], nst=2)
    assert sizing.vllm_ascend_0_23(h)["table_widths"] == [4, 6]


# ---- vllm-ascend 0.23.0.post1 compressed groups (DSV4): the release sizes their rows by the ratio -------

def compressed_group(width: int, **group):
    """vllm-ascend 0.23.0.post1: ``BlockTable.__init__`` gives a group whose spec has ``compress_ratio`` r
    ``max(cdiv(W, r), 1)`` entries (W = cdiv(max_model_len, B x PCP x DCP), the runner's), and
    ``get_compressed_pos_and_indices`` hands it positions ``num_computed // r`` .. ``total // r - 1``.
    tests/ut/worker/test_dsv4_compressed_positions.py's corrected case: ratio 4, 3 tokens computed, 1
    scheduled (step position 3) -> the group's own position 0 of request 0.

    Here DCP 2, B 128, max_model_len 4096: W = 16, the compressed table cdiv(16, 4) = 4. Step position 3
    is rank 1's (local 1 of block 2: 257); own position 0 is rank 0's (block 5: 640)."""
    groups = [{"name": "attn", "block_size": 128, "num_blocks": 8, "entry_size": 128},
              {"name": "comp", "block_size": 128, "num_blocks": 8, "entry_size": 128} | group]
    return _doc("v1", groups, {"max_model_len": 4096, "max_num_reqs": 1, "max_num_batched_tokens": 2},
                {"positions": [3], "query_start_loc": [0, 1], "g1/positions": [0], "g1/req_indices": [0],
                 "r0/g0/table": [[1] + [0] * 15], "r1/g0/table": [[2] + [0] * 15],
                 "r0/g1/table": [[5] + [0] * (width - 1)], "r1/g1/table": [[0] * width],
                 "r0/g0/num_blocks": [1], "r1/g0/num_blocks": [1],
                 "r0/g1/num_blocks": [1], "r1/g1/num_blocks": [0],
                 "r0/slots": [[P, P], [640, P]], "r1/slots": [[257, P], [P, P]]},
                cp={"dcp": 2})


def test_compressed_group_at_its_release_width_passes(tmp_path):
    assert _failed(compressed_group(4, compress_ratio=4), tmp_path, "vllm-ascend-0.23") == {}


def test_compressed_group_narrower_than_its_positions_fails(tmp_path):
    """3 entries hold own positions < 3 x 256 = 768, short of the 1024 = 4096 / 4 the group may reach."""
    assert _failed(compressed_group(3, compress_ratio=4), tmp_path, "vllm-ascend-0.23") == {"block-sizing": [
        "rank 0: table width 3 < 4 entries needed for positions < max_model_len / 4 = 1024 (block out of range)",
        "rank 1: table width 3 < 4 entries needed for positions < max_model_len / 4 = 1024 (block out of range)"]}


def test_uncompressed_group_at_that_width_fails(tmp_path):
    """Without the ratio the same 4-entry table is a sharded group's, short of cdiv(4096, 256) = 16."""
    assert set(_failed(compressed_group(4), tmp_path, "vllm-ascend-0.23")) == {"block-sizing"}


def test_compress_ratio_without_own_positions_is_exit_2(tmp_path):
    doc = compressed_group(4, compress_ratio=4)
    for name in ("g1/positions", "g1/req_indices"):
        del doc["arrays"][name]
    doc["arrays"]["r0/slots"] = [[P, P], [P, P]]
    with pytest.raises(ConfigError, match=r"compress_ratio 4 maps its own \(compressed\) positions"):
        _failed(doc, tmp_path, "vllm-ascend-0.23")


def test_compress_ratio_in_a_scenario_is_exit_2():
    """A scenario run maps the step's positions only; a compressed group is an explicit batch's."""
    doc = {"cp": {"dcp": 2}, "groups": [{"name": "comp", "compress_ratio": 4}],
           "batch": {"requests": [{"context_len": 0, "num_tokens": 4}]}}
    with pytest.raises(ConfigError, match=r"groups\[0\]\(comp\)\.compress_ratio: a compressed group maps its own"):
        sc.validate(sc.Scenario.from_dict(doc))

"""What `cpsim fuzz` reports: the examples it drew apart from the runs that shrank its findings, and each
kind of kernel note once with how many there were (issue 35 item 5)."""

from __future__ import annotations

import json

from cpsim import cli
from cpsim.kernels.subject import distinct_notes
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm


def test_drawn_examples_and_shrink_runs_are_counted_apart(tmp_path, capsys):
    """`--max-examples 40` with a fault that shows: the plain-random search draws exactly 40 scenarios, and
    shrinking the finding runs more; the summary and the last line count the two apart."""
    code = cli.main(["fuzz", "--paths", "v1", "--inject", "stale-tail", "--max-examples", "40", "--seed", "1",
                     "--no-db", "--quiet", "--shrink-seconds", "20", "--out", str(tmp_path), "--format", "plain"], runner=RUNNER)
    out = capsys.readouterr().out
    assert code == 1, out
    summary = json.loads((tmp_path / "fuzz-summary.json").read_text())
    assert summary["examples"] == 40, summary
    assert summary["shrink_runs"] > 0, summary
    assert f"40 examples drawn and {summary['shrink_runs']} shrink runs in " in out, out
    repro = json.loads(next(tmp_path.glob("repro-*.json")).read_text())
    assert repro["fuzz"]["examples"] == 40


def test_notes_that_differ_only_in_group_or_size_print_once_with_a_count():
    notes = ["group g0: slots reach 2147483700 but the vllm-ascend-v1 ABI writes int32 slot mappings",
             "group g1: slots reach 4294967400 but the vllm-ascend-v1 ABI writes int32 slot mappings",
             "group sw-2: slots reach 3000000000 but the vllm-ascend-v1 ABI writes int32 slot mappings",
             "the vllm-ascend-v1 kernel takes no is_padding input: is_padding tokens were set to PAD on the host",
             "group g0: a sliding-window ring table has no flag in this vllm-ascend-v1 kernel; group not checked"]
    assert distinct_notes(notes) == [
        notes[0] + " (3 notes like this one, for other groups or sizes)", notes[3], notes[4]]


def test_notes_of_different_kinds_are_not_merged():
    """The control: two notes whose words differ stay two lines, each without a count."""
    notes = ["group g0: slots reach 5 but the a ABI writes int32 slot mappings",
             "group g0: slots reach 5 but the b ABI writes int64 slot mappings"]
    assert distinct_notes(notes) == notes

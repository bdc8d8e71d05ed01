#!/usr/bin/env bash
# docs/img/report_user_kernel.png: the HTML report of a failing user kernel (issue 30), in headless Chromium.
# The kernel is tests/kernels/interleave_bug_v1.py (the one-line interleave bug); the scenario is CP 2,
# interleave 4, two requests. Needs chromium (apt-get install -y chromium). Run from the repository root.
set -euo pipefail
python=${PYTHON:-python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
PYTHONPATH=$PWD "$python" - "$work/newcomer.json" <<'PY'
import sys
from cpsim.scenario import Batch, CPConfig, KVGroup, Limits, Request, Scenario, validate
validate(Scenario("newcomer-interleave", CPConfig(dcp=2, interleave=4), (KVGroup("attn", "attention", 16, num_blocks=8),),
                  Limits(max_model_len=64, max_num_reqs=2, max_num_batched_tokens=32),
                  Batch((Request(0, 24, "prefill"), Request(8, 4, "decode")), (), 0))).dump(sys.argv[1])
PY
PYTHONPATH=$PWD "$python" -m cpsim run --scenario "$work/newcomer.json" --paths v1,v1-torch,v2 --quiet \
  --kernel-v1 tests/kernels/interleave_bug_v1.py:_compute_slot_mapping_kernel --html "$work/report.html" || test $? = 1
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile" \
  --window-size=1660,1460 --screenshot="$PWD/docs/img/report_user_kernel.png" "file://$work/report.html"

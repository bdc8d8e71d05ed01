#!/usr/bin/env bash
# The multi-GPU list (one rank per GPU, nccl) in one go, each step logged with its
# exit code against the exit code it should have. Used on the lent 2 x H200.
# Usage: scripts/multigpu_check.sh OUTDIR [NPROC]   (python: $PY, default python3)
set -uo pipefail
out=${1:?usage: scripts/multigpu_check.sh OUTDIR [NPROC]}
n=${2:-2}
mkdir -p "$out"
export PY=${PY:-python3} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# NVLink multicast stays off (the device docs: it can take shared GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset TRITON_INTERPRET
summary=$out/summary.md
echo "| step | command | expected | got | seconds |" > "$summary"
echo "| --- | --- | --- | --- | --- |" >> "$summary"
bad=0
step() {  # step NAME EXPECTED command...: run, log to OUTDIR/NAME.log, compare the exit code
    local name=$1 want=$2; shift 2
    local t0=$SECONDS
    "$@" > "$out/$name.log" 2>&1
    local rc=$?
    local ok=ok; [[ $rc -eq $want ]] || { ok=MISMATCH; bad=$((bad + 1)); }
    echo "| $name | \`${*}\` | $want | $rc $ok | $((SECONDS - t0)) |" >> "$summary"
    echo "$name want=$want rc=$rc $ok $((SECONDS - t0))s"
}
step env 0 bash -c 'nvidia-smi -L; '"$PY"' -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())"'
for preset in default decode-heavy long-prefill hybrid-mamba mtp; do
    step "local$n-$preset" 0 launch/local.sh "$n" --device cuda --scenario "$preset" --dcp "$n" --paths v1,v1-torch,v2
    step "local$n-$preset-tile" 0 launch/local.sh "$n" --device cuda --scenario "$preset" --dcp "$n" --paths v1,v2 --kernel-design tile
done
step "ci-matrix" 0 env NPROC="$n" launch/ci-8card.sh "$out/ci" --cp "$n" --device cuda
for bug in $("$PY" -c "from cpsim import faults; print(*faults.names())"); do
    step "bug-$bug" 1 launch/local.sh "$n" bugs reproduce "$bug" --device cuda
    step "bug-$bug-fixed" 0 launch/local.sh "$n" bugs reproduce "$bug" --fixed --device cuda
done
step replay-repro 1 launch/local.sh "$n" replay docs/examples/virtual-block-uses-kernel-block.json --device cuda
step doctor 0 launch/local.sh "$n" doctor --device cuda
echo "mismatches: $bad" | tee -a "$summary"
exit $((bad > 0))

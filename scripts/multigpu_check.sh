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
for preset in default decode-heavy long-prefill hybrid-mamba mtp partial-replica; do
    step "local$n-$preset" 0 launch/local.sh "$n" --device cuda --scenario "$preset" --dcp "$n" --paths v1,v1-torch,v2
    step "local$n-$preset-tile" 0 launch/local.sh "$n" --device cuda --scenario "$preset" --dcp "$n" --paths v1,v2 --kernel-design tile
done
step "ci-matrix" 0 env NPROC="$n" launch/ci-8card.sh "$out/ci" --cp "$n" --device cuda
for bug in $("$PY" -c "from cpsim import faults; print(*faults.names())"); do
    step "bug-$bug" 1 launch/local.sh "$n" bugs reproduce "$bug" --device cuda
    step "bug-$bug-fixed" 0 launch/local.sh "$n" bugs reproduce "$bug" --fixed --device cuda
done
step replay-repro 1 launch/local.sh "$n" replay examples/virtual-block-uses-kernel-block.json --device cuda
step doctor 0 launch/local.sh "$n" doctor --device cuda
# A real fault: rank 1 killed by its PID mid-run (its kernel stalls); rank 0 must exit
# non-zero within --timeout, naming rank 1, and the launcher must say so in one line.
kill_rank() {
    local pidf=$out/kill.pid timeout=30 t0 lp kpid p
    rm -f "$pidf"
    CPSIM_TEST_PID_FILE=$pidf launch/local.sh "$n" --device cuda --scenario mtp --dcp "$n" --paths v1 \
        --kernel-v1 tests/kernels/sleepy.py:slot_mapping --kernel-abi callable --timeout $timeout &
    lp=$!
    for _ in $(seq 600); do [[ -s $pidf ]] && break; sleep 0.2; done
    kpid=$(cat "$pidf"); p=$kpid
    # the rank process: the ancestor of the kernel whose parent is the launcher
    while ! tr '\0' ' ' < "/proc/$(awk '{print $4}' "/proc/$p/stat")/cmdline" | grep -q cpsim.run.launcher; do
        p=$(awk '{print $4}' "/proc/$p/stat")
    done
    echo "killing rank 1: pid $p (kernel pid $kpid)"
    t0=$SECONDS; kill -9 "$p"
    wait "$lp"; local rc=$?
    echo "launcher exit $rc, $((SECONDS - t0)) s after the kill (--timeout $timeout)"
    [[ $rc -ne 0 && $((SECONDS - t0)) -lt $timeout ]]
}
step kill-rank-1 0 kill_rank
echo "mismatches: $bad" | tee -a "$summary"
exit $((bad > 0))

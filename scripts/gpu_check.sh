#!/usr/bin/env bash
# Everything cpsim claims about a CUDA box, in one go (used on the lent H200):
# compiled Triton kernels against the reference, the virtual world on the GPU,
# and torchrun with nccl (1 rank) and with 8 ranks oversubscribed on one GPU.
# Usage: scripts/gpu_check.sh OUTDIR   (python: $PY, default python3)
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$out"
export PY=${PY:-python3} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
status=0
step() {  # step NAME command...: run, log to OUTDIR/NAME.log, record time and exit code
    local name=$1; shift
    local t0=$SECONDS
    "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc ${SECONDS}s-${t0}s=$((SECONDS - t0))s" | tee -a "$out/summary.txt"
    tail -n 25 "$out/$name.log"
    [[ $rc -eq 0 ]] || status=1
}
step env "$PY" -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
step kernels env CPSIM_TEST_DEVICE=cuda "$PY" -m pytest tests/test_kernels.py -q -x -n 8 -p no:cacheprovider
for preset in default hybrid-mamba mtp long-prefill decode-heavy partial-replica prefix-replay; do
    step "run-$preset" "$PY" -m cpsim run --device cuda --scenario "$preset" --paths v1,v1-torch,v2
    step "run-$preset-tile" "$PY" -m cpsim run --device cuda --scenario "$preset" --paths v1,v2 --kernel-design tile --quiet
done
# Users' kernels in the upstream signatures, compiled for the GPU (MRV2 v2 kernel, replay padding).
step user-mrv2 "$PY" -m cpsim run --device cuda --scenario partial-replica --paths v2 --kernel-v2 tests/kernels/vllm_mrv2_abi.py:_compute_slot_mappings_kernel --quiet
step user-replay "$PY" -m cpsim run --device cuda --scenario prefix-replay --paths v1,v2 --kernel-replay tests/kernels/vllm_replay_pad_abi.py:_pad_replayed_slots_kernel --quiet
step run-cp1-fused "$PY" -m cpsim run --device cuda --dcp 1 --quiet
step local-1 launch/local.sh 1 --device cuda
step local-8-oversubscribe launch/local.sh 8 --device cuda --oversubscribe
exit $status

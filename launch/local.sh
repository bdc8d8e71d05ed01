#!/usr/bin/env bash
# One node, any device: one process per device (npu, then cuda, then cpu).
set -euo pipefail
usage() {
    cat <<'TXT'
usage: launch/local.sh NPROC [run|sweep] [cpsim args...]

Start NPROC cpsim ranks on this machine with torchrun (--standalone). The
device is picked per rank (--device auto: npu, then cuda, then cpu); pass
--device / --oversubscribe / --timeout and any other cpsim option after NPROC.
The sub-command defaults to `run`.

examples:
  launch/local.sh 8                                # 8 NPUs or GPUs, default preset, CP 8
  launch/local.sh 8 --dcp 4                        # 2 CP groups of 4 (seeds 0 and 1)
  launch/local.sh 8 --device cuda --oversubscribe  # 8 ranks sharing the visible GPU(s)
  launch/local.sh 8 sweep --presets all --cp 2,4,8 --junit report.xml

environment: PY (python to use), TORCHRUN_ARGS (extra torchrun options),
ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES (which devices are visible).
TXT
    exit "${1:-2}"
}
case "${1:-}" in -h|--help) usage 0 ;; "") usage 2 ;; esac
source "$(dirname "$0")/_common.sh"
need_nproc "$1"
nproc=$1; shift
cmd=$(cpsim_command "$@"); [[ "${1:-}" == "$cmd" ]] && shift
# shellcheck disable=SC2086
exec "$PY" -m torch.distributed.run --standalone --nproc-per-node "$nproc" ${TORCHRUN_ARGS:-} \
    -m cpsim "$cmd" "$@"

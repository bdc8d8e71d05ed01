#!/usr/bin/env bash
# One node, any device: one process per device (npu, then cuda, then cpu).
set -euo pipefail
usage() {
    cat <<'TXT'
usage: launch/local.sh NPROC [run|sweep|replay|doctor|fuzz|bugs reproduce] [cpsim args...]

Start NPROC cpsim ranks on this machine with torchrun (--standalone). The
device is picked per rank (--device auto: npu, then cuda, then cpu); pass
--device / --oversubscribe / --timeout and any other cpsim option after NPROC.
The sub-command defaults to `run`; `replay FILE` reruns a repro file and
`bugs reproduce NAME [--fixed]` a catalogue bug on every CP group of the job
(the CP size comes from the file / the bug's scenario; NPROC must be a multiple).

examples:
  launch/local.sh 8                                # 8 NPUs or GPUs, default preset, CP 8
  launch/local.sh 8 --dcp 4                        # 2 CP groups of 4 (seeds 0 and 1)
  launch/local.sh 8 --device cuda --oversubscribe  # 8 ranks sharing the visible GPU(s)
  launch/local.sh 8 sweep --presets all --cp 2,4,8 --junit report.xml
  launch/local.sh 8 replay out/repro-<fingerprint>.json  # exit 1 while the violation shows
  launch/local.sh 2 bugs reproduce stale-tail --fixed    # exit 0: the fixed form is clean
  launch/local.sh 8 doctor                         # every rank checks its device; one all-gather

Exit codes are cpsim's (0 pass, 1 violation or failed run, 2 bad input); a
non-zero exit ends in one line, `cpsim: exit N (...)`, naming the ranks and
the folder with torchrun's own logs (TORCHRUN_ARGS="--log-dir DIR", default a
new $TMPDIR/cpsim-torchrun-* folder) instead of torchrun's traceback.

environment: PY (python to use), TORCHRUN_ARGS (extra torchrun options),
ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES (which devices are visible).
TXT
    exit "${1:-2}"
}
case "${1:-}" in -h|--help) usage 0 ;; "") usage 2 ;; esac
source "$(dirname "$0")/_common.sh"
need_nproc "$1"
nproc=$1; shift
cpsim_command "$@"; shift "$CMD_WORDS"
# shellcheck disable=SC2086
exec "$PY" -m cpsim.run.launcher --standalone --nproc-per-node "$nproc" ${TORCHRUN_ARGS:-} \
    -m cpsim "${CMD[@]}" "$@"

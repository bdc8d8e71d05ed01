#!/usr/bin/env bash
# N simulated ranks on CPU: gloo collectives, Triton interpreter, any N on any core count.
set -euo pipefail
usage() {
    cat <<'TXT'
usage: launch/cpu-sim.sh NPROC [run|sweep|replay|doctor|fuzz|bugs reproduce] [cpsim args...]

Simulate NPROC ranks on the CPU with torchrun: gloo for collectives, the Triton
interpreter for the kernels (TRITON_INTERPRET=1), one thread per process so
more ranks than cores still make progress. Extra arguments go to cpsim
(the sub-command defaults to `run`; `replay FILE` and `bugs reproduce NAME`
take their CP size from the file / the bug's scenario, and NPROC must be a
multiple of it).

examples:
  launch/cpu-sim.sh 8                                   # default preset, CP 8
  launch/cpu-sim.sh 8 --dcp 4 --json report.json        # 2 CP groups of 4
  launch/cpu-sim.sh 4 --scenario mtp --paths v1,v2 --timeout 60
  launch/cpu-sim.sh 8 sweep --presets default,mtp --cp 2,4,8 --junit report.xml
  launch/cpu-sim.sh 4 replay out/repro-<fingerprint>.json --html replay.html
  launch/cpu-sim.sh 2 bugs reproduce stale-tail          # exit 1: the bug shows on both CP groups
  launch/cpu-sim.sh 2 doctor                             # environment, kernels and one all-gather per rank

Exit codes are cpsim's (0 pass, 1 violation or failed run, 2 bad input); a
non-zero exit ends in one line, `cpsim: exit N (...)`, naming the ranks and
the folder with torchrun's own logs (TORCHRUN_ARGS="--log-dir DIR", default a
new $TMPDIR/cpsim-torchrun-* folder) instead of torchrun's traceback.

environment: PY (python to use), TORCHRUN_ARGS (extra torchrun options).
TXT
    exit "${1:-2}"
}
case "${1:-}" in -h|--help) usage 0 ;; "") usage 2 ;; esac
source "$(dirname "$0")/_common.sh"
need_nproc "$1"
nproc=$1; shift
cpsim_command "$@"; shift "$CMD_WORDS"
export TRITON_INTERPRET=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# shellcheck disable=SC2086
exec "$PY" -m cpsim.run.launcher --standalone --nproc-per-node "$nproc" ${TORCHRUN_ARGS:-} \
    -m cpsim "${CMD[@]}" --device cpu "$@"

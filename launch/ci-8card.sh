#!/usr/bin/env bash
# The 8-card CI matrix: CP 2, 4, 8 as 4, 2, 1 replicas, every preset, both paths.
set -euo pipefail
usage() {
    cat <<'TXT'
usage: launch/ci-8card.sh OUTDIR [cpsim sweep args...]

Run the CI matrix on one 8-card node: every preset at CP 2, 4 and 8 (4, 2 and 1
replicas, seeds 0..R-1) through the v1 family (v1 Triton kernel, v1 DCP torch
path, v1-fused where it applies) and v2. Writes
  OUTDIR/report.json   the full report
  OUTDIR/report.xml    JUnit XML, one testcase per (scenario, path, invariant)
  OUTDIR/logs/         per-rank stdout/stderr (torchrun --log-dir / --redirects)
and exits 1 on any violation (2 on bad input), ending in one line that names
the ranks and OUTDIR/logs instead of torchrun's traceback. Extra arguments are appended to
`cpsim sweep` (later flags win), e.g. --device cuda, --timeout 600, or
--presets default,mtp to narrow it.

environment: PY (python), NPROC (ranks, default 8), TORCHRUN_ARGS,
ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES, HCCL_CONNECT_TIMEOUT, HCCL_EXEC_TIMEOUT.
TXT
    exit "${1:-2}"
}
case "${1:-}" in -h|--help) usage 0 ;; "") usage 2 ;; esac
source "$(dirname "$0")/_common.sh"
out=$1; shift
mkdir -p "$out/logs"
nproc=${NPROC:-8}
need_nproc "$nproc"
# shellcheck disable=SC2086
exec "$PY" -m cpsim.run.launcher --standalone --nproc-per-node "$nproc" \
    --log-dir "$out/logs" --redirects 3 --tee 0:3 ${TORCHRUN_ARGS:-} \
    -m cpsim sweep --presets all --cp 2,4,8 --quiet \
    --json "$out/report.json" --junit "$out/report.xml" "$@"

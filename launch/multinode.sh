#!/usr/bin/env bash
# torchrun across nodes with c10d rendezvous; run the same command on every node.
set -euo pipefail
usage() {
    cat <<'TXT'
usage: launch/multinode.sh --nnodes N --nproc-per-node P --rdzv-endpoint HOST:PORT
                           [--node-rank K] [--rdzv-id ID] [--] [run|sweep|replay|doctor|bugs reproduce] [cpsim args...]

Start P ranks on this node and join the c10d rendezvous at HOST:PORT; the job
starts once N nodes have joined (world size N x P). Run it on every node with
the same arguments. HOST should be node 0's address; with --node-rank, node 0
hosts the rendezvous store (is_host) and the others connect to it. Without
--node-rank, the node whose address matches HOST hosts it.
Options may also come from NNODES, NPROC_PER_NODE, RDZV_ENDPOINT, NODE_RANK, RDZV_ID.

example: 2 nodes x 8 NPUs, CP 16 (one group across both nodes)
  node0$ launch/multinode.sh --nnodes 2 --nproc-per-node 8 --rdzv-endpoint node0:29400 --node-rank 0
  node1$ launch/multinode.sh --nnodes 2 --nproc-per-node 8 --rdzv-endpoint node0:29400 --node-rank 1
example: the same 16 ranks as 2 CP groups of 8 (one per node), JSON report on node 0's rank 0
  nodeK$ launch/multinode.sh --nnodes 2 --nproc-per-node 8 --rdzv-endpoint node0:29400 --node-rank K \
             -- --dcp 8 --json report.json

Exit codes are cpsim's (0 pass, 1 violation or failed run, 2 bad input); a
non-zero exit ends in one line, `cpsim: exit N (...)`, naming the ranks and
the folder with torchrun's own logs (TORCHRUN_ARGS="--log-dir DIR", default a
new $TMPDIR/cpsim-torchrun-* folder) instead of torchrun's traceback.

environment: PY, TORCHRUN_ARGS, ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES,
HCCL_CONNECT_TIMEOUT, HCCL_EXEC_TIMEOUT, GLOO_SOCKET_IFNAME / HCCL_SOCKET_IFNAME / NCCL_SOCKET_IFNAME
(which network interface the collectives use).
TXT
    exit "${1:-2}"
}
nnodes=${NNODES:-}; nproc=${NPROC_PER_NODE:-}; endpoint=${RDZV_ENDPOINT:-}
node_rank=${NODE_RANK:-}; rdzv_id=${RDZV_ID:-cpsim}
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage 0 ;;
        --nnodes) nnodes=$2; shift 2 ;;
        --nproc-per-node) nproc=$2; shift 2 ;;
        --rdzv-endpoint) endpoint=$2; shift 2 ;;
        --node-rank) node_rank=$2; shift 2 ;;
        --rdzv-id) rdzv_id=$2; shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
if [[ -z "$nnodes" || -z "$nproc" || -z "$endpoint" ]]; then
    echo "error: --nnodes, --nproc-per-node and --rdzv-endpoint are required (see --help)" >&2
    exit 2
fi
source "$(dirname "$0")/_common.sh"
need_nproc "$nproc"
extra=()
if [[ -n "$node_rank" ]]; then
    host=false; [[ "$node_rank" == 0 ]] && host=true
    extra+=(--node-rank "$node_rank" --rdzv-conf "is_host=$host")
fi
cpsim_command "$@"; shift "$CMD_WORDS"
# shellcheck disable=SC2086
exec "$PY" -m cpsim.run.launcher --nnodes "$nnodes" --nproc-per-node "$nproc" \
    --rdzv-backend c10d --rdzv-endpoint "$endpoint" --rdzv-id "$rdzv_id" "${extra[@]}" ${TORCHRUN_ARGS:-} \
    -m cpsim "${CMD[@]}" "$@"

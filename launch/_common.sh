# Sourced by the launch scripts: finds the repo and a Python that has torch.
# PY=/path/to/python wins; then the repo's .venv; then python3 on PATH.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -n "${PY:-}" ]]; then
    :
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PY="$ROOT/.venv/bin/python"
else
    PY=python3
fi
# A fresh clone works without `pip install -e .`.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# cpsim sub-command: the first extra argument if it is one, else `run`.
cpsim_command() {
    case "${1:-}" in run|sweep) echo "$1" ;; *) echo run ;; esac
}

need_nproc() {
    if ! [[ "${1:-}" =~ ^[1-9][0-9]*$ ]]; then
        echo "error: NPROC must be a positive integer, got '${1:-}' (see --help)" >&2
        exit 2
    fi
}

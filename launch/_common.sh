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

# The cpsim sub-command from the first extra arguments: sets CMD (the words, e.g. `bugs reproduce`)
# and CMD_WORDS (how many arguments they took; 0 when the command defaults to `run`).
# Launcher options such as --device go after CMD, so `bugs` takes its action with it.
cpsim_command() {
    case "${1:-}" in
        run|sweep|replay|doctor|fuzz) CMD=("$1"); CMD_WORDS=1 ;;
        bugs)
            if [[ "${2:-}" != reproduce ]]; then
                echo "error: under torchrun only \`bugs reproduce NAME\` runs (got \`bugs ${2:-}\`)" >&2
                exit 2
            fi
            CMD=(bugs reproduce); CMD_WORDS=2 ;;
        *) CMD=(run); CMD_WORDS=0 ;;
    esac
}

need_nproc() {
    if ! [[ "${1:-}" =~ ^[1-9][0-9]*$ ]]; then
        echo "error: NPROC must be a positive integer, got '${1:-}' (see --help)" >&2
        exit 2
    fi
}

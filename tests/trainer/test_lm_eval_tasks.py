"""EleutherAI lm-eval (its own virtualenv) through the evaluator against a real server: a local
multiple-choice task scored by ``local-completions`` (``echo`` + ``logprobs`` prompt log-probs)
equals the same task scored by lm-eval's ``sglang-generate`` client (``/generate``'s
``input_token_logprobs``) and with transformers on the same model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from arealite.api.config.run import EvaluatorConfig, LMEvalConfig
from arealite.trainer.eval_hook import run_evaluation
from arealite.trainer.lm_eval_tasks import read_results
from tests.support.procs import kill_group

LMEVAL_PY = Path(__file__).resolve().parents[2] / ".venv-lmeval" / "bin" / "python"

DOCS = [
    {"question": f"Q: what is {a} plus {b}? A:", "choices": choices, "answer": gold}
    for a, b, choices, gold in [
        (2, 3, ["5", "seven", "12 apples", "none of them"], 0),
        (1, 1, ["three", "2", "eleven", "10 and more"], 1),
        (4, 4, ["zero", "44", "8", "a lot"], 2),
        (3, 6, ["nine", "36", "0", "9"], 3),
        (5, 5, ["10", "55", "one", "twenty"], 0),
        (7, 1, ["71", "8", "six", "17"], 1),
        (6, 2, ["eight", "62", "4", "8"], 3),
        (9, 0, ["90", "0", "9", "nine"], 2),
    ]
]
TASK = """task: tiny_sums
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


def transformers_accuracy(model_dir: str) -> float:
    """lm-eval's loglikelihood scoring recomputed with transformers: context + " " + choice,
    the continuation's tokens as lm-eval splits them, summed log-probs, argmax vs the gold."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    right = 0
    for doc in DOCS:
        scores = []
        for choice in doc["choices"]:
            ctx = tok.encode(doc["question"], add_special_tokens=False)
            whole = tok.encode(doc["question"] + " " + choice, add_special_tokens=False)
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)
            scores.append(sum(logp[i - 1, whole[i]].item() for i in range(len(ctx), len(whole))))
        right += int(max(range(len(scores)), key=scores.__getitem__) == doc["answer"])
    return right / len(DOCS)


class _Engine:  # what the evaluator reads of the eval engine: its servers
    def __init__(self, address: str) -> None:
        self.addresses = [address]


@pytest.mark.integration
@pytest.mark.long  # lm-eval alone takes about a minute on 2 busy cores
def test_lm_eval_multiple_choice_through_the_evaluator(
    tool_server, tool_model_dir, tmp_path, monkeypatch
):
    if not LMEVAL_PY.exists():
        pytest.skip("lm-eval's virtualenv is missing (make setup-lmeval)")
    from transformers import AutoTokenizer

    data = tmp_path / "tiny_sums.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tiny_sums.yaml").write_text(TASK.format(data=data))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing from a hub: local data and tokenizer
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg = EvaluatorConfig(
        lm_eval=LMEvalConfig(
            tasks=["tiny_sums"],
            python=str(LMEVAL_PY),
            include_path=str(tasks),
            num_concurrent=2,
            timeout=600,
        )
    )
    # lm-eval's client for SGLang's native /generate, on the same server, alongside
    sglang_out = tmp_path / "sglang-generate"
    model_args = (
        f"base_url=http://{tool_server}/generate,tokenizer={tool_model_dir},"
        "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=2"
    )
    sglang = subprocess.Popen(
        [
            str(LMEVAL_PY),
            "-m",
            "lm_eval",
            "--model",
            "sglang-generate",
            "--model_args",
            model_args,
            "--tasks",
            "tiny_sums",
            "--include_path",
            str(tasks),
            "--output_path",
            str(sglang_out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
        start_new_session=True,
    )
    try:
        tok = AutoTokenizer.from_pretrained(str(tool_model_dir))
        out = run_evaluation(
            None,
            _Engine(tool_server),
            None,
            [],
            cfg,
            eval_fn=lambda engine, rows: {},
            context={"tokenizer": tok},
        )
        _, err = sglang.communicate(timeout=600)
    finally:
        kill_group(sglang)  # the lm-eval process and anything it started
    assert sglang.returncode == 0, err[-2000:]
    acc = out["eval/lm_eval/tiny_sums/acc"]
    assert acc == pytest.approx(transformers_accuracy(str(tool_model_dir)), abs=1e-9)
    assert read_results(str(sglang_out))[0]["eval/lm_eval/tiny_sums/acc"] == acc
    assert "eval/lm_eval/tiny_sums/acc_stderr" in out and out["timeperf/eval"] > 0
    assert os.path.exists(cfg.lm_eval.python)


def test_missing_lm_eval_python_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="make setup-lmeval"):
        LMEvalConfig(tasks=["x"], python=str(tmp_path / "nope" / "python"))
    assert LMEvalConfig(python=str(tmp_path / "nope")).tasks == []  # no tasks: not checked

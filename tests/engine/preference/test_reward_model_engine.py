"""Reward-model training on the FSDP engine: the Bradley–Terry loss against a loop; the engine's
per-sequence scores equal a transformers forward of the same weights (HF's pooled output for
one unpadded sequence); the two-pass update over split micro-batches moves the weights exactly as
one backward of the whole-batch loss; and the model learns the preference it trains on."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.api.config.actor import OptimizerConfig
from arealite.api.io_struct import FinetuneSpec, SaveLoadMeta
from arealite.engine.preference.losses import bradley_terry_loss
from arealite.engine.preference.reward_model import (
    RewardModelActor,
    RewardModelEngine,
    sequence_scores,
)
from arealite.engine.sft.lm_engine import build_sft_batch
from arealite.utils.fsdp import full_state_dict
from tests.support.fsdp_helpers import engine_config

SPEC = FinetuneSpec(total_train_epochs=1, dataset_size=40, train_batch_size=4)
LINEAR_OPT = OptimizerConfig(lr=1.0, eps=1.0, gradient_clipping=1e9)  # update ~ gradient


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x > 0 else x - math.log1p(math.exp(x))


@pytest.mark.parametrize("with_margin,center", [(False, 0.0), (True, 0.01)])
def test_bradley_terry_matches_loop(with_margin, center):
    g = torch.Generator().manual_seed(3)
    rc, rr, m = (torch.randn(11, generator=g, dtype=torch.float64) * 4 for _ in range(3))
    losses = bradley_terry_loss(rc, rr, m if with_margin else None, center)
    for i in range(len(rc)):
        d = float(rc[i] - rr[i]) - (float(m[i]) if with_margin else 0.0)
        want = -_log_sigmoid(d) + center * float(rc[i] + rr[i]) ** 2
        assert abs(float(losses[i]) - want) < 1e-12
    # the gradient pushes chosen up and rejected down
    x = rc.clone().requires_grad_(True)
    bradley_terry_loss(x, rr).sum().backward()
    assert bool((x.grad < 0).all())


def _engine(path, optimizer, mb=10_000) -> RewardModelEngine:
    e = RewardModelEngine(engine_config(path, optimizer=optimizer, max_tokens_per_mb=mb),
                          device="cpu", backend="gloo")
    e.initialize(ft_spec=SPEC)
    return e


def _pairs(tok):
    prompts = ["1+2=", "3+4=", "2+2=", "5+1="]
    chosen = ["3", "7", "4", "6"]
    rejected = ["5", "12 8", "22", "9"]
    p2 = [p for p in prompts for _ in range(2)]
    c2 = [c for pair in zip(chosen, rejected) for c in pair]
    return build_sft_batch(tok, p2, c2, use_chat_template=False)


def test_scores_equal_a_transformers_forward(tiny_model_dir, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForSequenceClassification

    data = _pairs(tiny_tokenizer)
    eng = _engine(tiny_model_dir, None, mb=12)  # several micro-batches
    scores = sequence_scores(eng, data)
    eng.save(SaveLoadMeta(str(tmp_path / "rm"), "hf"))
    hf = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "rm"),
                                                            dtype=torch.float32).eval()
    assert hf.config.architectures == ["Qwen2ForSequenceClassification"]
    for i in range(len(scores)):
        ids = data["input_ids"][i][data["attention_mask"][i].bool()]
        assert int(ids[-1]) != hf.config.pad_token_id  # HF pools the last non-pad token
        with torch.no_grad():
            want = float(hf(input_ids=ids[None]).logits[0, 0])
        assert abs(float(scores[i]) - want) < 1e-5, (i, float(scores[i]), want)
    eng.destroy()


def test_two_pass_update_equals_the_whole_batch_gradient(tiny_model_dir, tiny_tokenizer):
    data = _pairs(tiny_tokenizer)
    split = _engine(tiny_model_dir, LINEAR_OPT, mb=12)  # pairs split across micro-batches
    whole = _engine(tiny_model_dir, LINEAR_OPT)
    w0 = {k: v.clone() for k, v in full_state_dict(split.model).items()}
    st = RewardModelActor(split, center_coef=0.01).train_step(data)
    assert st["n_mbs"] > 2

    def whole_batch_loss(out, mb):
        r = out[mb["cu_seqlens"][1:].long() - 1, 0].double()
        return bradley_terry_loss(r[0::2], r[1::2], center_coef=0.01).mean().float()

    ref = whole.train_batch(dict(data), whole_batch_loss, lambda mb: 1.0)
    assert ref["n_mbs"] == 1.0 and abs(ref["loss"] - st["loss"]) < 1e-5
    a, b = full_state_dict(split.model), full_state_dict(whole.model)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    moved = max(float((a[k] - w0[k]).abs().max()) for k in a)
    assert moved > 1e-4 and worst < 1e-6 * max(moved, 1.0), (worst, moved)
    split.destroy()
    whole.destroy()


def test_learns_the_preference(tiny_model_dir, tiny_tokenizer):
    data = _pairs(tiny_tokenizer)
    eng = _engine(tiny_model_dir, OptimizerConfig(lr=3e-3))
    actor = RewardModelActor(eng)
    first = actor.evaluate(data)
    for _ in range(6):
        actor.train_step(data)
    last = actor.evaluate(data)
    assert last["loss"] < first["loss"] - 0.1
    assert last["scores/accuracy"] == 1.0 and last["scores/margin"] > 0
    eng.destroy()

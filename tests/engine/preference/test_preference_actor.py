"""PreferenceActor on the real FSDP engine: its two-pass update (no-grad sequence logps, then the
per-row surrogate over any micro-batch split) moves the weights exactly as one backward of the
whole-batch DPO loss does, and DPO / KTO learn a preference on the tiny model."""

from __future__ import annotations

import pytest
import torch

from arealite.api.config.actor import OptimizerConfig
from arealite.api.io_struct import FinetuneSpec
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs
from arealite.engine.ppo.policy_losses import packed_seq_ids
from arealite.engine.preference.actor import PreferenceActor, sequence_logps
from arealite.engine.preference.losses import dpo_loss
from arealite.engine.sft.lm_engine import build_sft_batch
from arealite.utils.fsdp import full_state_dict
from tests.support.fsdp_helpers import engine_config

SPEC = FinetuneSpec(total_train_epochs=1, dataset_size=40, train_batch_size=4)
LINEAR_OPT = OptimizerConfig(lr=1.0, eps=1.0, gradient_clipping=1e9)  # update ~ gradient


def _engine(path, optimizer, mb=10_000) -> FSDPEngine:
    e = FSDPEngine(engine_config(path, optimizer=optimizer, max_tokens_per_mb=mb),
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


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_two_pass_update_equals_the_whole_batch_dpo_gradient(tiny_model_dir, tiny_tokenizer,
                                                              loss_type):
    data = _pairs(tiny_tokenizer)
    ref = _engine(tiny_model_dir, None)
    pol = _engine(tiny_model_dir, LINEAR_OPT, mb=12)  # several micro-batches, pairs split
    direct = _engine(tiny_model_dir, LINEAR_OPT)  # one micro-batch holding every pair
    # a policy different from the reference, so the loss is not at its symmetric point
    with torch.no_grad():
        for e in (pol, direct):
            for p in e.model.parameters():
                p.mul_(1.05)  # a scalar op: the parameters are DTensors
    w0 = {k: v.clone() for k, v in full_state_dict(pol.model).items()}
    ref_logp, n_tok = sequence_logps(ref, data)
    actor = PreferenceActor(pol, ref, beta=0.5)
    st = actor.dpo_step(data, loss_type)
    assert torch.isfinite(torch.tensor(st["loss"])) and st["n_mbs"] > 2

    def whole_batch_loss(logits, mb):
        ids, n = packed_seq_ids(mb["cu_seqlens"])
        lp = torch.where(mb["loss_mask"].bool(), gather_logprobs(logits, mb["labels"]), 0.0)
        s = torch.zeros(n, dtype=lp.dtype).index_add(0, ids, lp).double()
        losses, _, _ = dpo_loss(s[0::2], s[1::2], ref_logp[0::2], ref_logp[1::2], 0.5,
                                loss_type, n_tok[0::2], n_tok[1::2])
        return losses.mean().float()

    out = direct.train_batch(dict(data), whole_batch_loss, lambda mb: 1.0)
    assert out["n_mbs"] == 1.0
    assert abs(out["loss"] - st["loss"]) < 1e-5
    a, b = full_state_dict(pol.model), full_state_dict(direct.model)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    moved = max(float((a[k] - w0[k]).abs().max()) for k in a)
    assert moved > 1e-4 and worst < 1e-6 * max(moved, 1.0), (worst, moved)
    for e in (ref, pol, direct):
        e.destroy()


def test_dpo_and_kto_learn_the_preference(tiny_model_dir, tiny_tokenizer):
    data = _pairs(tiny_tokenizer)
    ref = _engine(tiny_model_dir, None)
    opt = OptimizerConfig(lr=3e-3)
    pol = _engine(tiny_model_dir, opt)
    actor = PreferenceActor(pol, ref, beta=0.5)
    first = actor.dpo_step(data)
    for _ in range(6):
        last = actor.dpo_step(data)
    assert last["loss"] < first["loss"] - 0.1
    assert last["rewards/accuracy"] == 1.0 and last["rewards/margin"] > 0
    pol.destroy()

    # KTO on the same rows, unpaired: chosen desirable, rejected not
    kto = dict(data)
    kto["desirable"] = torch.arange(8) % 2 == 0
    swapped = build_sft_batch(tiny_tokenizer, ["1+2=", "3+4=", "2+2=", "5+1="] * 2,
                              ["7", "4", "6", "3", "12 8", "22", "9", "5"],
                              use_chat_template=False)
    pol = _engine(tiny_model_dir, opt)
    actor = PreferenceActor(pol, ref, beta=0.5)
    first = actor.kto_step(kto, swapped)
    for _ in range(6):
        last = actor.kto_step(kto, swapped)
    assert last["loss"] < first["loss"]
    assert last["rewards/desirable"] > last["rewards/undesirable"]
    assert last["kto/reference_point"] >= 0.0
    pol.destroy()
    ref.destroy()

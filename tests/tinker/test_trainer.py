"""Parity: the gradient of one Tinker ``forward_backward`` (packed micro-batches, the service's
alignment) with each built-in loss equals the gradient of arealite's own loss on the same
tokens, computed the way the main loop computes it (the engine's packing of whole sequences,
``labels`` as next tokens, per-token keys on the token they describe): the SFT loss for
``cross_entropy``, the PPO actor loss for ``ppo`` (and, with clipping off, for
``importance_sampling``), arealite's CISPO, and DRO's formula. Also: the returned log-probs are a
plain HF forward's, and ``optim_step`` lowers the loss it was given."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tinker")  # arealite.tinker.wire reads the SDK's protobuf

from arealite.api.config.actor import LoRAConfig, OptimizerConfig, TrainEngineConfig
from arealite.engine.functional import gather_logprobs
from arealite.engine.ppo.loss import ppo_actor_loss_fn
from arealite.engine.ppo.policy_losses import cispo
from arealite.engine.sft.lm_engine import sft_loss_fn
from arealite.tinker.trainer import AdamStep, TinkerModel
from arealite.tinker.wire import Datum

LO, HI, BETA = 0.8, 1.25, 0.3


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> TinkerModel:
    # a small micro-batch budget: the three rows go through two micro-batches
    cfg = TrainEngineConfig(path=str(tiny_model_dir), dtype="float32", max_tokens_per_mb=16,
                            optimizer=OptimizerConfig(lr=1e-3))
    return TinkerModel(cfg, "cpu", "gloo", seed=1)


def _rows(seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (n,), generator=g).tolist() for n in (7, 11, 5)]


def _per_token(rows, seed: int = 1):
    """Per target position: weights, sampler log-probs (ratios off both clips), advantages."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in rows:
        n = len(r) - 1
        out.append({"weights": (torch.arange(n) >= 2).float(),
                    "logprobs": -5.8 + torch.randn(n, generator=g) * 0.4,
                    "advantages": torch.randn(n, generator=g)})
    return out


def _grads(model: TinkerModel) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.params]


def _tinker_grads(model, rows, extra, loss_fn, config):
    data = [Datum(r[:-1], {"target_tokens": torch.tensor(r[1:]), **x})
            for r, x in zip(rows, extra)]
    model.engine.optimizer.zero_grad(set_to_none=True)
    outs, metrics = model.forward_backward(data, loss_fn, config, forward_only=False)
    return _grads(model), outs, metrics["loss:sum"]


def _arealite_grads(model, rows, extra, loss_fn):
    """The main loop's way: whole sequences packed by the engine, keys on their tokens."""
    e = model.engine
    B, S = len(rows), max(map(len, rows))
    batch = {"input_ids": torch.zeros(B, S, dtype=torch.long),
             "attention_mask": torch.zeros(B, S, dtype=torch.long)}
    for k in ("loss_mask", "old_logp", "advantages"):
        batch[k] = torch.zeros(B, S)
    for b, (r, x) in enumerate(zip(rows, extra)):
        batch["input_ids"][b, : len(r)] = torch.tensor(r)
        batch["attention_mask"][b, : len(r)] = 1
        # token t (t >= 1) is predicted at t - 1: its keys sit on it, as in a trajectory
        batch["loss_mask"][b, 1: len(r)] = x["weights"] if loss_fn == "cross_entropy" else 1.0
        if "logprobs" in x:
            batch["old_logp"][b, 1: len(r)] = x["logprobs"]
            batch["advantages"][b, 1: len(r)] = x["advantages"]
    e.optimizer.zero_grad(set_to_none=True)
    mbl = e.split_micro_batches(batch)
    for mb, idx in zip(mbl.mbs, mbl.indices):
        if not idx:
            continue
        p = e.pack(mb, idx)
        logits = e.model_forward(p)
        lm = p["loss_mask"].bool()
        n = lm.sum()
        logp = gather_logprobs(logits, p["labels"])
        q, adv = p["old_logp"], p["advantages"]
        if loss_fn == "cross_entropy":
            # weights are 0/1 here: arealite's SFT loss is their weighted mean
            loss = sft_loss_fn(logits, p) * n
        elif loss_fn in ("ppo", "importance_sampling"):
            eps, hi = (1 - LO, HI - 1) if loss_fn == "ppo" else (1e9, 1e9)  # no clip: IS
            loss = ppo_actor_loss_fn(logp, None, q, adv, eps, lm, eps_clip_higher=hi)[0] * n
        elif loss_fn == "cispo":
            seq = torch.zeros_like(logp, dtype=torch.long)
            loss = cispo(logp, q, adv, lm, seq, 1, 1 - LO, HI - 1)[0].sum()
        else:  # dro
            loss = -torch.where(lm, logp * adv - 0.5 * BETA * (logp - q) ** 2, 0.0).sum()
        loss.backward()
    return _grads(model)


CONFIGS = {"cross_entropy": None, "importance_sampling": None,
           "ppo": {"clip_low_threshold": LO, "clip_high_threshold": HI},
           "cispo": {"clip_low_threshold": LO, "clip_high_threshold": HI}, "dro": {"beta": BETA}}


@pytest.mark.parametrize("loss_fn", sorted(CONFIGS))
def test_gradient_equals_arealite_loss(model, loss_fn):
    rows = _rows()
    extra = _per_token(rows)
    if loss_fn == "cross_entropy":
        extra = [{"weights": x["weights"]} for x in extra]
    got, outs, _ = _tinker_grads(model, rows, extra, loss_fn, CONFIGS[loss_fn])
    want = _arealite_grads(model, rows, extra, loss_fn)
    assert len(got) == len(want) > 0
    scale = max(float(w.abs().max()) for w in want)
    assert scale > 0
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * scale)
    model.engine.optimizer.zero_grad(set_to_none=True)


def test_logprobs_are_a_plain_forward(model):
    rows = _rows(3)
    data = [Datum(r[:-1], {"target_tokens": torch.tensor(r[1:])}) for r in rows]
    outs, _ = model.forward_backward(data, "cross_entropy", None, forward_only=True)
    with torch.no_grad():
        for r, o in zip(rows, outs):
            logits = model.engine.model(input_ids=torch.tensor([r[:-1]])).logits[0].float()
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r[1:])[:, None])[:, 0]
            torch.testing.assert_close(torch.from_numpy(o["logprobs"]), ref, rtol=0, atol=1e-5)


def test_optim_step_lowers_the_loss_lora(tiny_model_dir):
    cfg = TrainEngineConfig(path=str(tiny_model_dir), dtype="float32",
                            optimizer=OptimizerConfig(lr=1e-3), lora=LoRAConfig(rank=4))
    m = TinkerModel(cfg, "cpu", "gloo", seed=2)
    rows = _rows(5)
    data = [Datum(r[:-1], {"target_tokens": torch.tensor(r[1:])}) for r in rows]
    _, before = m.forward_backward(data, "cross_entropy", None, forward_only=False)
    stats = m.optim_step(AdamStep(learning_rate=1e-2))
    _, after = m.forward_backward(data, "cross_entropy", None, forward_only=True)
    assert stats["grad_norm"] > 0 and stats["step"] == 1
    assert after["loss:sum"] < before["loss:sum"]
    assert all(p.grad is None for p in m.params)  # forward_only added nothing
    m.destroy()

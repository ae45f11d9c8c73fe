"""Differential checks against TRL's own loss code (``trl`` as pinned in
requirements/trl.txt, installed into .venv by ``make setup``): TRL's GRPO loss types
``grpo``, ``bnpo``, ``dr_grpo``, ``dapo`` and ``cispo`` give the same loss and the same gradient
as our policy loss + aggregation on the same per-token log-probabilities.

TRL computes its loss inside ``GRPOTrainer._compute_loss``; a real trainer is built on the tiny
model and only its log-probability forward (``_get_per_token_logps_and_entropies``) is replaced
by the test's tensor, so everything after it is TRL's code as shipped."""

from __future__ import annotations

import pytest
import torch

from arealite.engine.ppo import policy_losses as P

trl = pytest.importorskip("trl", reason="trl is installed by make setup")

B, T, MAX_NEW = 6, 7, 7
EPS, EPS_HIGH = 0.2, 0.28
# TRL loss type -> (our policy loss, our aggregation, loss_agg_norm)
PAIRS = {
    "grpo": ("ppo", "seq_mean_token_mean", None),
    "bnpo": ("ppo", "token_mean", None),
    "dapo": ("ppo", "token_mean", None),
    "dr_grpo": ("ppo", "seq_mean_token_sum_norm", MAX_NEW),
    "cispo": ("cispo", "token_mean", None),
}


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([7, 1, 5, 3, 6, 2])
    mask = (torch.arange(T)[None] < lens[:, None]).long()
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, adv, mask


def _trainer(tiny_model_dir, tmp_path, loss_type: str):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                          per_device_train_batch_size=B, num_generations=B,
                          max_completion_length=MAX_NEW, loss_type=loss_type, beta=0.0,
                          epsilon=EPS, epsilon_high=5.0 if loss_type == "cispo" else EPS_HIGH)
    tr = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                         reward_funcs=lambda completions, **_: [0.0] * len(completions),
                         args=args, train_dataset=Dataset.from_list([{"prompt": "a"}] * B),
                         processing_class=AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    tr.model.train()
    tr.current_gradient_accumulation_steps = 1
    return tr


def _trl_loss(tr, logp, old, adv, mask):
    lp = logp.clone().requires_grad_(True)
    tr._get_per_token_logps_and_entropies = lambda *a, **k: (lp, torch.zeros_like(lp), None)
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long),
              "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old,
              "num_items_in_batch": mask.sum()}
    loss = tr._compute_loss(tr.model, inputs)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


def _our_loss(loss_type, logp, old, adv, mask):
    name, agg, norm = PAIRS[loss_type]
    lm = mask.bool()
    seq_ids = torch.arange(B)[:, None].expand(B, T)[lm]
    lp = logp.clone().requires_grad_(True)
    # CISPO in TRL clips the weight from above only (epsilon_high is the cap itself)
    eps, hi = (1.0, 5.0 - 1.0) if name == "cispo" else (EPS, EPS_HIGH)
    tok, _ = P.POLICY_LOSSES[name](lp[lm], old[lm], adv[:, None].expand(B, T)[lm],
                                   torch.ones(int(lm.sum()), dtype=torch.bool), seq_ids, B,
                                   eps, hi)
    fn, _ = P.LOSS_AGGREGATIONS[agg]
    loss = fn(tok, torch.ones_like(tok, dtype=torch.bool), seq_ids, B, norm)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


@pytest.mark.parametrize("loss_type", list(PAIRS))
def test_grpo_loss_types_equal_trls(loss_type, tiny_model_dir, tmp_path):
    tr = _trainer(tiny_model_dir, tmp_path, loss_type)
    for seed in range(3):
        logp, old, adv, mask = _inputs(seed)
        theirs, g_theirs = _trl_loss(tr, logp, old, adv, mask)
        ours, g_ours = _our_loss(loss_type, logp, old, adv, mask)
        assert float(ours) == pytest.approx(float(theirs), rel=1e-9, abs=1e-12), loss_type
        torch.testing.assert_close(g_ours, g_theirs, rtol=1e-9, atol=1e-12)
        assert g_theirs.abs().sum() > 0  # the clip does not silence every token

"""FSDPPPOCritic: values aligned with the GAE convention, clipped value loss that learns."""

from __future__ import annotations

import torch

from arealite.api.config.actor import OptimizerConfig, PPOCriticConfig
from arealite.api.io_struct import FinetuneSpec
from arealite.engine.ppo.actor import FSDPPPOActor
from arealite.engine.ppo.advantages import gae_advantages, kl_shaped_token_rewards
from arealite.engine.ppo.critic import FSDPPPOCritic
from tests.support.fsdp_helpers import actor_config, random_trajectories


def test_ppo_with_gae_and_a_learning_critic(tiny_model_dir):
    spec = FinetuneSpec(total_train_epochs=1, dataset_size=20, train_batch_size=1)
    critic = FSDPPPOCritic(PPOCriticConfig(path=str(tiny_model_dir), max_tokens_per_mb=64,
                                           optimizer=OptimizerConfig(lr=3e-4), value_eps_clip=0.5),
                           device="cpu", backend="gloo")
    critic.initialize(ft_spec=spec)
    actor = FSDPPPOActor(actor_config(tiny_model_dir, discount=0.9, gae_lambda=0.8,
                                      adv_norm=False), device="cpu", backend="gloo")
    actor.initialize(ft_spec=spec)
    data = random_trajectories(4, seed=30)
    data["values"] = critic.compute_values(data)
    assert data["values"].shape == data["input_ids"].shape
    assert (data["values"][:, 0] == 0).all() and data["values"][:, 1:].abs().sum() > 0
    data["prox_logp"] = actor.compute_logp(data)
    actor.compute_advantages(data)
    tok, _ = kl_shaped_token_rewards(data["rewards"], data["prox_logp"], None,
                                     data["loss_mask"], 0.0)
    ref_adv, ref_ret = gae_advantages(tok, data["values"], data["loss_mask"], 0.9, 0.8)
    assert torch.allclose(data["advantages"], ref_adv, atol=1e-6)
    assert torch.allclose(data["returns"], ref_ret, atol=1e-6)
    losses = []
    for _ in range(8):
        data["values"] = critic.compute_values(data)  # old values of this update
        st = critic.ppo_update(data)
        losses.append(st["value_loss"])
    print("value losses", [round(v, 4) for v in losses])
    assert losses[-1] < 0.5 * losses[0], losses
    assert 0.0 <= st["value_clip_ratio"] <= 1.0
    critic.destroy()
    actor.destroy()

"""PPO critic (optional: GRPO needs none) over any ``TrainEngine`` holding a value model.

``compute_values(data)`` returns ``values [B, S]`` with ``values[b, t]`` the value of the state
*before* token t (the model's output at position t - 1, by the engine's shift convention),
which is what ``arealite.engine.ppo.advantages.gae_advantages`` expects. Use::

    batch["values"] = critic.compute_values(batch)
    actor.compute_advantages(batch)          # GAE with the values; adds "returns"
    critic.ppo_update(batch)                 # clipped value loss against the returns
"""

from __future__ import annotations

import functools

import torch

from arealite.api.config.actor import PPOCriticConfig
from arealite.api.engine_api import TrainEngine
from arealite.api.trajectory import TensorDict
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.packing import balanced_partition, select_rows, seqlens_from_mask
from arealite.engine.ppo.loss import critic_loss
from arealite.observe.stats_tracker import StatsTracker


class PPOCritic:
    def __init__(self, config: PPOCriticConfig, engine: TrainEngine):
        self.config = config
        self.engine = engine
        self.tracker = StatsTracker("ppo_critic")

    @torch.no_grad()
    def compute_values(self, data: TensorDict) -> torch.Tensor:
        return self.engine.forward(data, post_hook=lambda out, mb: out.squeeze(-1).float())

    def ppo_update(self, data: TensorDict) -> dict[str, float]:
        for k in ("values", "returns"):
            if k not in data:
                raise KeyError(f"critic ppo_update needs data[{k!r}] (compute_values, then the "
                               "actor's compute_advantages)")
        lens = seqlens_from_mask(data["attention_mask"]).tolist()
        loss_fn = functools.partial(critic_loss, config=self.config, tracker=self.tracker)
        for idx in balanced_partition(lens, self.config.ppo_n_minibatches):
            st = self.engine.train_batch(select_rows(data, idx), loss_fn,
                                         lambda p: p["loss_mask"].sum())
            self.tracker.scalar(value_loss=st["loss"], grad_norm=st["grad_norm"], lr=st["lr"])
        self.engine.step_lr_scheduler()
        group = getattr(self.engine, "dp_group", None)
        return self.tracker.export(reduce_group=group)


class FSDPPPOCritic(FSDPEngine):
    model_kind = "value"

    def __init__(self, config: PPOCriticConfig, device: str = "auto", backend: str = "auto",
                 seed: int = 1):
        super().__init__(config, device=device, backend=backend, seed=seed)
        self.critic = PPOCritic(config, self)

    def compute_values(self, data: TensorDict) -> torch.Tensor:
        return self.critic.compute_values(data)

    def ppo_update(self, data: TensorDict) -> dict[str, float]:
        return self.critic.ppo_update(data)

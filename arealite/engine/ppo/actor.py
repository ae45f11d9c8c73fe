"""PPO/GRPO actor over any ``TrainEngine``: logprobs, advantages and the (decoupled) update.

One trainer step of the entry script::

    actor.prepare_prox_logp(batch)                          # proximal policy, when needed
    if ref is not None:
        batch["ref_logp"] = ref.compute_logp(batch)          # frozen reference (kl_ctl > 0)
    actor.compute_advantages(batch)                         # adds advantages, returns, ...
    stats = actor.ppo_update(batch)

Batch keys (trajectory contract of ``arealite.api.trajectory``): ``logprobs`` are the behaviour
logprobs from the servers, ``prox_logp`` the recomputed ones, ``ref_logp`` the reference
model's. The meaning of ``recompute_logprob`` / ``use_decoupled_loss`` is documented at the top
of ``arealite.engine.ppo.loss``, beside the loss; the advantages are ``arealite.engine.ppo.advantages``. Groups (``group_size`` consecutive rows) must not be split
across ranks; batch-level advantage normalisation is reduced across ranks.

No forward whose result is known (``prepare_prox_logp``): with one minibatch and no KL term the
proximal policy is the weights the update's own forward runs with, so the update takes the
proximal logprobs from that forward (detached) and writes them back to ``batch["prox_logp"]``;
otherwise rows whose every generated token is of the current version take their behaviour
logprobs and only the other rows are recomputed.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
import torch.distributed as dist

from arealite.api.config.actor import PPOActorConfig
from arealite.api.engine_api import TrainEngine
from arealite.api.io_struct import VersionClock
from arealite.api.trajectory import TensorDict
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs, last_true_index
from arealite.engine.packing import (
    balanced_partition,
    select_rows,
    seqlens_from_mask,
    unpack_to_padded,
)
from arealite.engine.ppo.advantages import kl_shaped_token_rewards, reward_transform
from arealite.engine.ppo.estimators import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    overlong_penalty,
)
from arealite.engine.ppo.loss import actor_loss, actor_loss_weight
from arealite.observe.stats_tracker import StatsTracker


class PPOActor:
    """The algorithm; ``engine`` does the distributed forward/backward."""

    def __init__(self, config: PPOActorConfig, engine: TrainEngine, eos_token_ids=()):
        self.config = config
        self.engine = engine
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.tracker = StatsTracker("ppo_actor")

    # ------------------------------------------------------------------ logprobs

    @torch.no_grad()
    def compute_logp(self, data: TensorDict, temperature: float | None = None) -> torch.Tensor:
        """``[B, S]`` logprob of each token under the engine's current weights (0 at t = 0),
        at the actor's temperature (which must equal the generation temperature)."""
        temp = self.config.temperature if temperature is None else temperature

        def hook(logits: torch.Tensor, mb: TensorDict) -> torch.Tensor:
            return gather_logprobs(logits, mb["labels"], temperature=temp)

        return self.engine.forward(data, post_hook=hook)

    @property
    def fuses_prox_logp(self) -> bool:
        """The update's forward gives the proximal logprobs: one optimizer step (the weights do
        not move between its micro-batches) and no KL term (advantages do not read them)."""
        c = self.config
        # (with context parallelism a micro-batch's logprobs are split over ranks: recompute)
        return (c.recompute_logprob and c.ppo_n_minibatches == 1 and c.kl_ctl == 0
                and c.context_parallel_size == 1)

    @torch.no_grad()
    def prepare_prox_logp(self, data: TensorDict) -> str:
        """Make the proximal logprobs available at the least cost; returns how: ``none``
        (not used), ``fused`` (left to ``ppo_update``, see the module docstring) or
        ``recomputed:N`` (N stale rows ran a forward, the others took their behaviour logprobs)."""
        if not self.config.recompute_logprob:
            return "none"
        if self.fuses_prox_logp:
            data.pop("prox_logp", None)
            return "fused"
        lm = data["loss_mask"].bool()
        if "versions" in data:
            current = (data["versions"] == self.engine.get_version()) | ~lm
            stale = torch.nonzero(~current.all(1)).squeeze(-1)
        else:
            stale = torch.arange(lm.shape[0])
        prox = torch.where(lm, data["logprobs"].float(), 0.0)
        if len(stale):
            got = self.compute_logp(select_rows(data, stale))
            prox[stale, : got.shape[1]] = got
            prox[stale, got.shape[1]:] = 0.0
        data["prox_logp"] = prox
        # rows that took their behaviour logprobs agree with them by construction: the
        # server/trainer agreement check (rollout_stats) must look only at forwarded rows
        forwarded = torch.zeros(lm.shape[0], dtype=torch.bool, device=lm.device)
        forwarded[stale] = True
        data["prox_forwarded"] = forwarded
        return f"recomputed:{len(stale)}"

    # ------------------------------------------------------------------ advantages

    def _no_eos(self, data: TensorDict) -> torch.Tensor:
        """True for samples cut before EOS (``no_eos`` key when given, else last token check)."""
        if "no_eos" in data:
            return data["no_eos"].bool()
        if not self.eos_token_ids:
            raise ValueError("mask_no_eos_with_zero needs eos_token_ids or a `no_eos` key")
        last = last_true_index(data["attention_mask"].bool()).clamp_min(0)
        tok = data["input_ids"].gather(1, last[:, None]).squeeze(1)
        return ~torch.isin(tok, torch.tensor(self.eos_token_ids, device=tok.device))

    @torch.no_grad()
    def compute_advantages(self, data: TensorDict) -> None:
        """Add ``advantages``, ``returns``, ``token_rewards`` and ``kl`` (all ``[B, S]``) and the
        transformed ``shaped_rewards [B]`` to ``data`` in place."""
        c = self.config
        lm = data["loss_mask"].bool()
        B = lm.shape[0]
        formed = "group_baseline" in data  # groups formed by the workflow, not by rows
        if formed and c.group_adv_norm:
            raise ValueError("group_adv_norm groups consecutive rows; a workflow that forms its "
                             "own groups (group_baseline) needs group_reward_norm instead")
        if B % c.group_size and not formed:
            raise ValueError(f"batch of {B} rows is not a whole number of groups of {c.group_size}")
        rewards = reward_transform(data["rewards"], c.reward_bias, c.reward_scaling, c.reward_clip)
        if c.mask_no_eos_with_zero:
            rewards = torch.where(self._no_eos(data), 0.0, rewards)
        if c.overlong_max_len is not None:
            rewards = rewards + overlong_penalty(lm.sum(1), c.overlong_max_len,
                                                 c.overlong_buffer_len, c.overlong_penalty_factor)
        base = scale = None
        if formed:
            # A workflow that forms its groups itself (agent sessions, whose segments are
            # several rows of one sample) gives each row its group's mean and std of raw
            # rewards; they go through the same affine transform as the rewards.
            base = reward_transform(data["group_baseline"], c.reward_bias, c.reward_scaling,
                                    c.reward_clip)
            scale = data["group_scale"].float() * abs(c.reward_scaling)
        if c.recompute_logprob and "prox_logp" not in data and c.kl_ctl > 0:
            raise KeyError("recompute_logprob=True: call prepare_prox_logp(data) first")
        # with kl_ctl == 0 the "old" logprobs only give the KL term's shape
        old = data["prox_logp"] if "prox_logp" in data else data["logprobs"]
        ref = data.get("ref_logp")
        if c.kl_ctl > 0 and ref is None:
            raise KeyError("kl_ctl > 0 needs data['ref_logp'] from the reference model")
        _, kl = kl_shaped_token_rewards(rewards, old, ref, lm, c.kl_ctl)
        # the estimator is a config value: one registry lookup, no branch on its name
        out = ADVANTAGE_ESTIMATORS[c.adv_estimator](AdvantageInputs(
            rewards, kl, lm, data.get("values"), c, _group(self.engine), base, scale))
        data["advantages"] = out.advantages
        data["returns"] = out.returns
        data["token_rewards"] = out.token_rewards
        data["kl"] = kl
        data["shaped_rewards"] = out.shaped_rewards

    # ------------------------------------------------------------------ update

    def ppo_update(self, data: TensorDict) -> dict[str, float]:
        """``ppo_n_minibatches`` optimizer steps over token-balanced minibatches, then one
        scheduler step. Returns statistics averaged over tokens of all ranks."""
        c = self.config
        if "advantages" not in data:
            raise KeyError("call compute_advantages(data) before ppo_update(data)")
        fused = c.recompute_logprob and "prox_logp" not in data
        if fused and not self.fuses_prox_logp:
            raise KeyError("recompute_logprob=True but data has no 'prox_logp'")
        self._record_batch_stats(data)
        lens = seqlens_from_mask(data["attention_mask"]).tolist()
        parts = balanced_partition(lens, c.ppo_n_minibatches)
        step_stats = []
        sink: list[tuple[torch.Tensor, TensorDict]] | None = [] if fused else None
        loss_fn = functools.partial(actor_loss, config=c, tracker=self.tracker, prox_sink=sink)
        weight_fn = functools.partial(actor_loss_weight, config=c)
        for idx in parts:
            mb = select_rows(data, idx)
            if fused:
                mb["row_index"] = torch.as_tensor(idx, dtype=torch.long)
            step_stats.append(self.engine.train_batch(mb, loss_fn, weight_fn))
        self.engine.step_lr_scheduler()
        if fused:
            data["prox_logp"] = _gather_prox(sink, data["input_ids"].shape)
            data["prox_forwarded"] = torch.ones(data["input_ids"].shape[0], dtype=torch.bool)
        for s in step_stats:
            self.tracker.scalar(grad_norm=s["grad_norm"], lr=s["lr"], loss=s["loss"],
                                update_successful=s["update_successful"])
        routing = getattr(self.engine, "routing", None)
        if routing is not None:  # this step's forwards: log-prob recompute and update
            for key, value in routing.take_stats().items():  # "moe/agreement/layer0", ...
                *scopes, name = key.split("/")
                with contextlib.ExitStack() as stack:
                    for s in scopes:
                        stack.enter_context(self.tracker.scope(s))
                    self.tracker.scalar(**{name: value})
        return self.tracker.export(reduce_group=_group(self.engine))

    def _record_batch_stats(self, data: TensorDict) -> None:
        t = self.tracker
        lm = data["loss_mask"].bool()
        seq = torch.ones(lm.shape[0], dtype=torch.bool)
        t.denominator(n_seqs=seq, n_valid_tokens=lm)
        t.stat(denominator="n_seqs", task_reward=data["rewards"].float(),
               shaped_reward=data["shaped_rewards"].float(),
               seq_len=data["attention_mask"].sum(1).float(), gen_len=lm.sum(1).float())
        t.stat(denominator="n_valid_tokens", advantages=data["advantages"].float(),
               kl_vs_ref=data["kl"].float())
        if "versions" in data:
            stale = (self.engine.get_version() - data["versions"]).float()
            t.stat(denominator="n_valid_tokens", staleness=stale)


def _gather_prox(sink: list[tuple[torch.Tensor, TensorDict]], shape: torch.Size) -> torch.Tensor:
    """The proximal logprobs the update's micro-batches computed, back to ``[B, S]`` (each value
    on the token it describes; 0 off the loss mask, where the loss computes none)."""
    out = torch.zeros(shape, dtype=torch.float32)
    for logp, mb in sink:
        cu = mb["cu_seqlens"].cpu()
        width = int((cu[1:] - cu[:-1]).max())
        padded = unpack_to_padded(logp.float().cpu(), cu, width, shift_back=True)
        out[mb["row_index"].cpu(), :width] = padded
    return out


def _group(engine: TrainEngine) -> Any:
    return getattr(engine, "dp_group", None) if dist.is_initialized() else None


class FSDPPPOActor(FSDPEngine):
    """``FSDPEngine`` with the actor's methods; also serves as the frozen reference model
    (``optimizer: null`` in its config, use only ``compute_logp``)."""

    def __init__(self, config: PPOActorConfig, device: str = "auto", backend: str = "auto",
                 seed: int = 1, clock: VersionClock | None = None):
        super().__init__(config, device=device, backend=backend, seed=seed, clock=clock)
        self.actor = PPOActor(config, self)
        if config.shared_prompt_packing:
            self.prefix_group_size = config.group_size

    def initialize(self, addr=None, ft_spec=None) -> None:
        super().initialize(addr, ft_spec)
        eos = getattr(self.hf_config, "eos_token_id", None)
        self.actor.eos_token_ids = tuple(eos if isinstance(eos, (list, tuple)) else
                                         ([] if eos is None else [eos]))

    def compute_logp(self, data: TensorDict, temperature: float | None = None) -> torch.Tensor:
        return self.actor.compute_logp(data, temperature)

    def prepare_prox_logp(self, data: TensorDict) -> str:
        return self.actor.prepare_prox_logp(data)

    def compute_advantages(self, data: TensorDict) -> None:
        self.actor.compute_advantages(data)

    def ppo_update(self, data: TensorDict) -> dict[str, float]:
        return self.actor.ppo_update(data)

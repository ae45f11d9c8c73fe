"""PPO losses as plain tensor functions (tested against slow reference loops in
``tests/engine/ppo/test_loss.py``), and the one place that records the actor's and the critic's
per-micro-batch statistics.

Argument names follow AReaL's (``logprobs``, ``proximal_logprobs``, ``old_logprobs``, ...) so
results can be compared with its functions. Three policies appear in the decoupled loss:

- ``old_logprobs``: the *behaviour* policy, i.e. the logprobs the inference server reported when
  it sampled the tokens (possibly several weight versions old: asynchronous RL);
- ``proximal_logprobs``: the *proximal* policy, logprobs recomputed by the trainer with the
  weights it holds before this update (``recompute_logprob``);
- ``logprobs``: the policy being optimised (with gradients).

Semantics of the two switches (``PPOActorConfig``):

- ``use_decoupled_loss=True`` (needs ``recompute_logprob``): PPO's ratio and clipping are taken
  against the proximal policy, and each token's loss is multiplied by the detached behaviour
  importance weight ``exp(proximal - old)``, masked (or capped) by ``behav_imp_weight_cap``.
  This corrects for the staleness of asynchronous rollouts while keeping the trust region
  around a policy the trainer actually had.
- ``use_decoupled_loss=False, recompute_logprob=True``: standard PPO with the recomputed
  logprobs as the "old" policy; the behaviour logprobs are only used for statistics.
- ``recompute_logprob=False`` (decoupled must be off): standard PPO against the behaviour
  logprobs reported by the servers; no trainer forward pass before the update.

In the loss functions tensors may be ``[T]`` (packed) or ``[B, S]``; masks select the tokens.
"""

from __future__ import annotations

import torch

from arealite.api.config.actor import PPOActorConfig, PPOCriticConfig
from arealite.api.trajectory import TensorDict
from arealite.engine.functional import logprobs_and_entropy
from arealite.engine.ppo.corrections import behaviour_correction
from arealite.engine.ppo.policy_losses import (
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    packed_seq_ids,
    ppo_clip,
)
from arealite.observe.stats_tracker import ReduceType, StatsTracker


def ppo_actor_loss_fn(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor | None,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
    c_clip: float | None = None,
    behav_imp_weight_cap: float | None = None,
    eps_clip_higher: float | None = None,
    behav_imp_weight_mode: str = "mask",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The (decoupled) PPO policy loss, mean over the ``loss_mask`` tokens.

    ``proximal_logprobs=None`` is standard PPO against ``old_logprobs``. Otherwise the ratio
    ``exp(logprobs - proximal_logprobs)`` is clipped to ``[1 - eps_clip, 1 + eps_clip_higher]``
    (``eps_clip_higher`` defaults to ``eps_clip``); with ``c_clip`` the loss of a negative
    advantage is bounded by ``c_clip * |A|`` (dual clip); each token's loss is multiplied by the
    detached behaviour weight ``exp(proximal - old)``. ``behav_imp_weight_cap`` masks tokens
    whose weight exceeds it (``behav_imp_weight_mode="mask"``, AReaL's behaviour: they stay in
    the denominator) or truncates the weight to it (``"truncate"``).
    Returns (loss, per-token detached stats).
    """
    lm = loss_mask.bool()
    seq_ids = torch.zeros(lm.shape, dtype=torch.long, device=lm.device)  # token level: unused
    ref = old_logprobs if proximal_logprobs is None else proximal_logprobs
    loss, stats = ppo_clip(logprobs, ref, advantages, lm, seq_ids, 1, eps_clip,
                           eps_clip_higher=eps_clip_higher, c_clip=c_clip)
    if proximal_logprobs is not None:
        w, cstats = behaviour_correction(proximal_logprobs, old_logprobs, lm, seq_ids, 1,
                                         "token", behav_imp_weight_mode, behav_imp_weight_cap)
        loss = loss * w
        stats.update(cstats)
    stats["loss"] = loss.detach()
    return loss.sum() / lm.sum().clamp_min(1), stats


def ppo_critic_loss_fn(
    value: torch.Tensor,
    old_value: torch.Tensor,
    target_value: torch.Tensor,
    value_eps_clip: float | None,
    loss_mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ``0.5 * max((v - R)^2, (clip(v, v_old ± eps) - R)^2)``, mean over mask.
    ``value_eps_clip=None`` disables the clip."""
    lm = loss_mask.bool()
    l1 = (value - target_value).square()
    if value_eps_clip is None:
        loss = l1
        clip_mask = torch.zeros_like(lm)
    else:
        vc = old_value + (value - old_value).clamp(-value_eps_clip, value_eps_clip)
        l2 = (vc - target_value).square()
        loss = torch.maximum(l1, l2)
        clip_mask = (l2.detach() > l1.detach()) & lm
    loss = torch.where(lm, 0.5 * loss, 0.0)
    return loss.sum() / lm.sum().clamp_min(1), {"loss": loss.detach(), "clip_mask": clip_mask}


# --------------------------------------------------------------------------- one micro-batch
#
# What ``TrainEngine.train_batch`` calls per packed micro-batch: the loss above plus every
# statistic the update reports, recorded here and nowhere else. Bind ``config`` and ``tracker``
# with ``functools.partial`` to get the engine's ``loss_fn(logits, mb)``.


def actor_loss(
    logits: torch.Tensor, mb: TensorDict, config: PPOActorConfig, tracker: StatsTracker,
    prox_sink: list | None = None,
) -> torch.Tensor:
    """The policy loss of one micro-batch; which logprobs play which role follows the two
    switches described at the top of this module. With ``prox_sink`` (a list) the proximal
    logprobs are this forward's own, detached (the weights are the proximal policy's: see
    ``PPOActor.prepare_prox_logp``), and ``(logprobs, mb)`` is appended to it."""
    c = config
    lm = mb["loss_mask"].bool()
    # only the loss tokens' logprobs (0 elsewhere): every use below is under lm
    logp, entropy = logprobs_and_entropy(logits, mb["labels"], c.temperature, mask=lm)
    behave = mb["logprobs"]
    recomputed = mb.get("prox_logp")
    if prox_sink is not None:
        recomputed = logp.detach()
        prox_sink.append((recomputed, mb))
    if c.use_decoupled_loss:
        prox, old = recomputed, behave
    elif c.recompute_logprob:
        prox, old = None, recomputed  # standard PPO against the recomputed policy
    else:
        prox, old = None, behave  # standard PPO against the servers' logprobs
    loss, st = _registered_loss(logp, prox, old, mb, c)
    t = tracker
    t.denominator(n_tokens=lm, clipped_tokens=st["clip_mask"],
                  dual_clipped_tokens=st["dual_clip_mask"])
    t.stat(denominator="n_tokens", importance_weight=st["importance_weight"],
           approx_kl=st["approx_kl"], entropy=entropy.float(),
           new_logp=logp.detach().float(), behave_logp=behave.float())
    t.stat(denominator="n_tokens", reduce_type=ReduceType.AVG,
           clip_ratio=st["clip_mask"].float(), dual_clip_ratio=st["dual_clip_mask"].float(),
           behave_kl_vs_current=(behave - logp.detach()).float())
    if "behave_imp_weight" in st:
        t.stat(denominator="n_tokens", behave_imp_weight=st["behave_imp_weight"],
               behave_approx_kl=st["behave_approx_kl"])
        t.stat(denominator="n_tokens", reduce_type=ReduceType.AVG,
               behave_mask_ratio=st["behave_mask"].float(),
               behave_truncate_ratio=st["behave_truncated"].float(),
               mismatch_kl=st["mismatch_kl"].float())
    return loss


def _registered_loss(logp: torch.Tensor, prox: torch.Tensor | None, old: torch.Tensor,
                     mb: TensorDict, c: PPOActorConfig
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The configured policy loss per token, times the behaviour correction (decoupled loss
    only), reduced by the configured aggregation: three registry lookups, no branch on names."""
    lm = mb["loss_mask"].bool()
    seq_ids, n = packed_seq_ids(mb["cu_seqlens"])
    tok, st = POLICY_LOSSES[c.policy_loss](
        logp, old if prox is None else prox, mb["advantages"], lm, seq_ids, n, c.eps_clip,
        eps_clip_higher=c.eps_clip_higher, c_clip=c.c_clip)
    if prox is not None:
        w, cst = behaviour_correction(prox, old, lm, seq_ids, n, c.behav_imp_weight_level,
                                      c.behav_imp_weight_mode, c.behav_imp_weight_cap,
                                      c.behav_imp_weight_floor)
        tok = tok * w
        st.update(cst)
    aggregate, _ = LOSS_AGGREGATIONS[c.loss_agg_mode]
    return aggregate(tok, lm, seq_ids, n, c.loss_agg_norm), st


def actor_loss_weight(packed_mb: TensorDict, config: PPOActorConfig) -> float:
    """The micro-batch's weight in ``train_batch``'s mean, for the configured aggregation."""
    seq_ids, n = packed_seq_ids(packed_mb["cu_seqlens"])
    _, weight = LOSS_AGGREGATIONS[config.loss_agg_mode]
    return weight(packed_mb["loss_mask"].bool(), seq_ids, n)


def critic_loss(
    out: torch.Tensor, mb: TensorDict, config: PPOCriticConfig, tracker: StatsTracker
) -> torch.Tensor:
    """The clipped value loss of one micro-batch against ``returns``."""
    value = out.squeeze(-1).float()
    lm = mb["loss_mask"].bool()
    loss, st = ppo_critic_loss_fn(value, mb["values"], mb["returns"], config.value_eps_clip, lm)
    tracker.denominator(n_tokens=lm)
    tracker.stat(denominator="n_tokens", value=value.detach(),
                 value_error=(value.detach() - mb["returns"]).abs())
    tracker.stat(denominator="n_tokens", reduce_type=ReduceType.AVG,
                 value_clip_ratio=st["clip_mask"].float())
    return loss

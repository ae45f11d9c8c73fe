"""Per-step rollout statistics for the RL entry scripts (the held-out evaluation: ``heldout_eval``)."""

from __future__ import annotations

from typing import Any

import torch

from arealite.api.reward_api import reward_stats
from arealite.observe.length_bias import generated_lengths, length_bias_stats, run_mean_ratio


def batch_rollout_stats(batch: dict[str, torch.Tensor], rollout: Any, version: int, step_secs: float) -> dict[str, float]:
    """Reward, staleness (trainer version at the update minus each token's version), version
    span per trajectory, throughput, the executor's counters and the length bias of what was
    trained against what was generated (``observe/length_bias.py``)."""
    lm = batch["loss_mask"].bool()
    out: dict[str, float] = {
        "reward": batch["rewards"].float().mean().item(),
        "gen_len": lm.sum(1).float().mean().item(),
        "perf/tokens_per_sec": batch["attention_mask"].sum().item() / max(step_secs, 1e-9),
        "timeperf/step": step_secs,
    }
    if lm.any():
        v = batch["versions"]
        stale = (version - 1) - v[lm]  # weights trained at this step were version - 1
        out["staleness/avg"] = stale.float().mean().item()
        out["staleness/max"] = stale.max().item()
        for k in range(int(stale.max().item()) + 1):
            out[f"staleness/hist_{k}"] = (stale == k).float().mean().item()
        big = torch.iinfo(v.dtype).max
        vmax = torch.where(lm, v, -1).max(1).values
        vmin = torch.where(lm, v, big).min(1).values
        has = lm.any(1)
        out["version_span/mean"] = (vmax - vmin)[has].float().mean().item()
        # Invariant 4: tokens generated with the weights the trainer held while recomputing
        # logprobs must get the same logprob from server and trainer.
        fresh = lm & (v == version - 1)
        if "prox_forwarded" in batch:  # rows whose prox_logp is a copy of logprobs prove nothing
            fresh = fresh & batch["prox_forwarded"].to(fresh.device)[:, None]
        if "prox_logp" in batch and fresh.any():
            diff = (batch["logprobs"] - batch["prox_logp"]).abs()[fresh]
            out["logprob_agreement/max_abs_diff"] = diff.max().item()
            out["logprob_agreement/n_tokens"] = float(fresh.sum().item())
    counters = getattr(getattr(rollout, "executor", None), "counters", None)
    if callable(counters):
        for k, val in counters().items():
            out[f"rollout/{k}"] = float(val)
        # generated tokens thrown away as stale, over all generated tokens consumed so far
        gone, kept = out.get("rollout/stale_tokens", 0.0), out.get("rollout/trained_tokens", 0.0)
        if gone + kept > 0:
            out["rollout/untrained_token_share"] = gone / (gone + kept)
        out.update(run_mean_ratio(out))
    take = getattr(rollout, "take_generated", None)
    if callable(take) and "rewards" in batch:  # generated since the last step against trained
        gen_lens, gen_rewards = take()
        out.update(length_bias_stats(gen_lens, gen_rewards, generated_lengths(batch),
                                     batch["rewards"].float().reshape(-1).tolist()))
    for k, val in reward_stats().items():
        out[f"reward_fn/{k}"] = float(val)
    return out


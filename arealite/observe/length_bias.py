"""Length bias: does the trainer see the answers the policy generates, or a shorter sample of
them? Episodes that go stale, fail or are turned down are the long ones more often than not; a
run that drops or re-draws them trains on shorter answers than it generates (tinker-cookbook
#822). Per step, the generated side is every trajectory that finished generating since the
previous step (trained later, dropped as stale, or turned down by ``should_accept``) and the
trained side is the step's batch; per run, the executor's cumulative counters give the same
ratio over everything so far (``rollout/gen_tokens`` / ``rollout/gen_seqs`` against
``rollout/trained_gen_tokens`` / ``rollout/trained_seqs``).

A sequence's length is the tokens the policy generated in it (``versions >= 0``: the prompt,
tool feedback and padding are -1), trained or not (the long-tail workload's tokens after the
stop token are generated, cost decode time and go stale, but carry no loss); without
``versions``, its ``loss_mask`` tokens.

Stats (``length_bias/*``): ``mean_ratio`` and ``p90_ratio`` (trained over generated, 1 = no
bias), ``ks`` (the two-sample Kolmogorov-Smirnov statistic of the length distributions: the
largest gap between their empirical CDFs, 0 = same), ``reward_diff`` (trained minus generated
mean reward), ``run_mean_ratio`` (the cumulative mean-length ratio).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def ks_statistic(a: Sequence[float], b: Sequence[float]) -> float:
    """sup_x |F_a(x) - F_b(x)| over the two samples' empirical CDFs (0 when either is empty)."""
    if len(a) == 0 or len(b) == 0:
        return 0.0
    x = torch.sort(torch.as_tensor(a, dtype=torch.float64)).values
    y = torch.sort(torch.as_tensor(b, dtype=torch.float64)).values
    points = torch.cat([x, y])
    fa = torch.searchsorted(x, points, right=True).double() / len(x)
    fb = torch.searchsorted(y, points, right=True).double() / len(y)
    return float((fa - fb).abs().max())


def generated_lengths(traj: dict[str, torch.Tensor]) -> list[int]:
    """Per sequence, the tokens the policy generated (see above); [] without either key."""
    v, lm = traj.get("versions"), traj.get("loss_mask")
    mask = (v >= 0) if v is not None else lm
    if mask is None:
        return []
    return [int(n) for n in mask.reshape(mask.shape[0], -1).sum(1).tolist()]


def _p90(x: torch.Tensor) -> float:
    return float(torch.quantile(x.double(), 0.9))


def length_bias_stats(gen_lens: Sequence[float], gen_rewards: Sequence[float],
                      trained_lens: Sequence[float], trained_rewards: Sequence[float]) -> dict[str, float]:
    """The per-step ``length_bias/*`` figures; empty when either side has no sequence."""
    if len(gen_lens) == 0 or len(trained_lens) == 0:
        return {}
    g = torch.as_tensor(gen_lens, dtype=torch.float64)
    t = torch.as_tensor(trained_lens, dtype=torch.float64)
    out = {"length_bias/ks": ks_statistic(trained_lens, gen_lens),
           "length_bias/gen_mean_len": float(g.mean()),
           "length_bias/trained_mean_len": float(t.mean())}
    if g.mean() > 0:
        out["length_bias/mean_ratio"] = float(t.mean() / g.mean())
    if _p90(g) > 0:
        out["length_bias/p90_ratio"] = _p90(t) / _p90(g)
    if len(gen_rewards) and len(trained_rewards):
        out["length_bias/reward_diff"] = (float(torch.as_tensor(trained_rewards).double().mean())
                                          - float(torch.as_tensor(gen_rewards).double().mean()))
    return out


def run_mean_ratio(counters: dict[str, float]) -> dict[str, float]:
    """``length_bias/run_mean_ratio`` from the executor's cumulative counters (if it has them)."""
    gs, gt = counters.get("rollout/gen_seqs", 0.0), counters.get("rollout/gen_tokens", 0.0)
    ts, tt = counters.get("rollout/trained_seqs", 0.0), counters.get("rollout/trained_gen_tokens", 0.0)
    if gs > 0 and ts > 0 and gt > 0:
        return {"length_bias/run_mean_ratio": (tt / ts) / (gt / gs)}
    return {}

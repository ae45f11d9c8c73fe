"""Train–inference mismatch corrections of arealite.engine.ppo.corrections against slow loops,
and the configured actor loss (policy loss x correction, aggregated) on a packed micro-batch."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.api.config.actor import PPOActorConfig
from arealite.engine.packing import pack_tensor_dict
from arealite.engine.ppo import corrections as C
from arealite.engine.ppo import loss as L
from arealite.observe.stats_tracker import StatsTracker
from tests.engine.ppo.test_policy_losses import (
    LENS,
    _packed,
    _ref_aggregate,
    _ref_token_losses,
    _seqs,
)
from tests.support.random_batch import TOL


def _ref_weights(prox, behave, lm, seq_ids, level, mode, cap, floor):
    """Per token: (weight, kept, truncated) by the definitions of TIS / MIS / IcePop."""
    out = {}
    for idx in _seqs(lm, seq_ids):
        logs = [float(prox[i]) - float(behave[i]) for i in idx]
        for k, i in enumerate(idx):
            if level == "token":
                w = math.exp(logs[k])
            elif level == "sequence":  # product of the sample's token ratios
                w = math.prod(math.exp(x) for x in logs)
            else:  # geometric mean of the token ratios
                w = math.prod(math.exp(x) for x in logs) ** (1 / len(idx))
            kept, trunc = True, False
            if mode == "truncate" and cap is not None and w > cap:
                w, trunc = cap, True
            if mode == "mask" and ((cap is not None and w > cap)
                                   or (floor is not None and w < floor)):
                w, kept = 0.0, False
            out[i] = (w, kept, trunc)
    return out


CASES = [
    ("token", "mask", None, None),  # plain decoupled weight
    ("token", "truncate", 1.1, None),  # token TIS
    ("sequence", "truncate", 1.02, None),  # sequence TIS
    ("token", "mask", 1.1, None),  # token MIS (the old behav_imp_weight_cap)
    ("sequence", "mask", 1.02, None),  # sequence MIS
    ("geometric", "mask", 1.05, None),  # geometric-mean sequence MIS
    ("token", "mask", 1.15, 0.87),  # IcePop: two-sided token mask
]


@pytest.mark.parametrize("level,mode,cap,floor", CASES)
def test_correction_matches_loop(level, mode, cap, floor):
    prox, behave, _, lm, seq_ids = _packed(5)
    w, st = C.behaviour_correction(prox, behave, lm, seq_ids, len(LENS), level, mode, cap, floor)
    ref = _ref_weights(prox, behave, lm, seq_ids, level, mode, cap, floor)
    for i in range(len(lm)):
        rw, kept, trunc = ref.get(i, (0.0, False, False))
        assert abs(float(w[i]) - rw) < TOL * max(1.0, rw), i
        assert bool(st["behave_mask"][i]) == kept and bool(st["behave_truncated"][i]) == trunc
        k3 = 0.0
        if lm[i]:  # k3 estimate of KL(behave || prox) from behaviour samples
            r = math.exp(float(behave[i]) - float(prox[i]))
            k3 = (r - 1) - math.log(r)
        assert abs(float(st["mismatch_kl"][i]) - k3) < TOL
    if cap is not None:  # every case bounds some tokens
        assert (~st["behave_mask"] & lm).any() or st["behave_truncated"].any()


def test_correction_rejects_floor_with_truncation():
    prox, behave, _, lm, seq_ids = _packed(5)
    with pytest.raises(ValueError, match="mode=mask"):
        C.behaviour_correction(prox, behave, lm, seq_ids, len(LENS), "token", "truncate", 2.0, 0.5)


def _micro_batch(seed: int):
    """A padded batch with per-sample advantages, packed the way train_batch packs it."""
    g = torch.Generator().manual_seed(seed)
    B, S, V = 5, 11, 13
    lens = torch.tensor([11, 4, 8, 2, 9])
    am = torch.arange(S)[None] < lens[:, None]
    lm = am & (torch.arange(S)[None] >= 2)
    behave = -torch.rand(B, S, generator=g) * 2
    d = {"input_ids": torch.randint(0, V, (B, S), generator=g), "attention_mask": am,
         "loss_mask": lm, "logprobs": behave,
         "prox_logp": behave + 0.2 * torch.randn(B, S, generator=g),
         "advantages": torch.randn(B, generator=g)[:, None].expand(B, S).clone()}
    p = pack_tensor_dict(d)
    logits = torch.randn(p["labels"].shape[0], V, generator=g)
    return p, logits


@pytest.mark.parametrize("cfg", [
    dict(policy_loss="gspo", eps_clip=0.05, loss_agg_mode="seq_mean_token_mean",
         behav_imp_weight_level="sequence", behav_imp_weight_mode="truncate",
         behav_imp_weight_cap=1.2),
    dict(policy_loss="cispo", eps_clip=0.2, eps_clip_higher=0.28, loss_agg_mode="token_mean",
         behav_imp_weight_cap=1.2, behav_imp_weight_floor=0.8),
    dict(policy_loss="ppo", loss_agg_mode="seq_mean_token_sum_norm", loss_agg_norm=10.0,
         behav_imp_weight_level="geometric", behav_imp_weight_cap=1.05),
])
def test_configured_actor_loss_composes_loss_correction_and_aggregation(cfg):
    p, logits = _micro_batch(9)
    c = PPOActorConfig(**cfg)
    tracker = StatsTracker("t")
    got = L.actor_loss(logits, p, c, tracker)
    lm = p["loss_mask"].bool()
    seq_ids = torch.repeat_interleave(torch.arange(len(p["cu_seqlens"]) - 1),
                                      (p["cu_seqlens"][1:] - p["cu_seqlens"][:-1]).long())
    logp = torch.log_softmax(logits.double(), -1).gather(1, p["labels"][:, None].long())[:, 0]
    hi = c.eps_clip if c.eps_clip_higher is None else c.eps_clip_higher
    tok = _ref_token_losses(c.policy_loss, logp, p["prox_logp"], p["advantages"], lm, seq_ids,
                            c.eps_clip, hi, c.c_clip)
    w = _ref_weights(p["prox_logp"], p["logprobs"], lm, seq_ids, c.behav_imp_weight_level,
                     c.behav_imp_weight_mode, c.behav_imp_weight_cap, c.behav_imp_weight_floor)
    tok = {i: v * w[i][0] for i, v in tok.items()}
    n = len(p["cu_seqlens"]) - 1
    want = _ref_aggregate_n(c.loss_agg_mode, tok, lm, seq_ids, c.loss_agg_norm, n)
    assert abs(float(got) - want) < 1e-5  # float32 logits vs the float64 reference
    stats = tracker.export()
    assert 0.0 <= stats["behave_mask_ratio"] <= 1.0 and stats["mismatch_kl"] >= 0.0
    assert "behave_truncate_ratio" in stats
    # the sample of length 2 is all prompt: no generated token, no weight in the sample mean
    want_w = {"token_mean": float(lm.sum()), "seq_mean_token_mean": 4.0,
              "seq_mean_token_sum_norm": 5.0}[c.loss_agg_mode]
    assert L.actor_loss_weight(p, c) == want_w


def _ref_aggregate_n(mode, tok, lm, seq_ids, norm, n):
    if mode == "seq_mean_token_sum_norm":
        return sum(tok.values()) / (norm * n)
    return _ref_aggregate(mode, tok, lm, seq_ids, norm)

"""The algorithm choices through the real FSDP actor: at step 0 (behaviour = proximal = current
policy, every ratio 1) GSPO and CISPO are the plain policy gradient, so an update split over
several micro-batches must equal one taken from -agg(A * logp) over the whole batch at once;
this checks the registry wiring and the aggregations' micro-batch weights in train_batch."""

from __future__ import annotations

import pytest
import torch

from arealite.api.config.actor import OptimizerConfig
from arealite.api.io_struct import FinetuneSpec
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs
from arealite.engine.ppo.actor import FSDPPPOActor
from arealite.engine.ppo.policy_losses import LOSS_AGGREGATIONS, packed_seq_ids
from arealite.utils.fsdp import full_state_dict
from tests.support.fsdp_helpers import actor_config, engine_config, random_trajectories

SPEC = FinetuneSpec(total_train_epochs=1, dataset_size=40, train_batch_size=4)
# Adam with a large eps moves each weight by ~lr * gradient: the comparison is one of gradients
# (with the default eps, near-zero gradients are blown up to +-lr and float noise dominates)
LINEAR_OPT = OptimizerConfig(lr=1.0, eps=1.0, gradient_clipping=1e9)


@pytest.mark.parametrize("estimator,policy_loss,agg", [
    ("rloo", "gspo", "seq_mean_token_mean"),
    ("dr_grpo", "cispo", "seq_mean_token_sum_norm"),
])
def test_step0_update_is_the_aggregated_policy_gradient(tiny_model_dir, estimator, policy_loss,
                                                        agg):
    data = random_trajectories(8, seed=21, group_size=4)
    data["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    # small micro-batches: the update is split, the micro-batch weights must recombine it
    actor = FSDPPPOActor(actor_config(tiny_model_dir, group_size=4, adv_estimator=estimator,
                                      policy_loss=policy_loss, loss_agg_mode=agg,
                                      loss_agg_norm=20.0, max_tokens_per_mb=40,
                                      behav_imp_weight_cap=2.0, optimizer=LINEAR_OPT),
                         device="cpu", backend="gloo")
    actor.initialize(ft_spec=SPEC)
    w0 = {k: v.clone() for k, v in full_state_dict(actor.model).items()}
    data["prox_logp"] = actor.compute_logp(data)
    data["logprobs"] = torch.where(data["loss_mask"], data["prox_logp"], 0.0)
    actor.compute_advantages(data)
    assert data["advantages"].abs().sum() > 0
    st = actor.ppo_update(data)
    assert st["clip_ratio"] == 0.0 and st["behave_mask_ratio"] == 1.0

    ref = FSDPEngine(engine_config(tiny_model_dir, max_tokens_per_mb=10_000,
                                   optimizer=LINEAR_OPT), device="cpu",
                     backend="gloo")
    ref.initialize(ft_spec=SPEC)
    aggregate, _ = LOSS_AGGREGATIONS[agg]

    def pg_loss(logits, mb):
        lm = mb["loss_mask"].bool()
        tok = torch.where(lm, -mb["advantages"] * gather_logprobs(logits, mb["labels"]), 0.0)
        ids, n = packed_seq_ids(mb["cu_seqlens"])
        return aggregate(tok, lm, ids, n, 20.0)

    out = ref.train_batch(dict(data), pg_loss, lambda mb: 1.0)
    assert out["n_mbs"] == 1.0
    a, b = full_state_dict(actor.model), full_state_dict(ref.model)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    moved = max(float((b[k] - w0[k]).abs().max()) for k in b)
    assert moved > 1e-4 and worst < 1e-6 * max(moved, 1.0), (worst, moved)
    actor.destroy()
    ref.destroy()

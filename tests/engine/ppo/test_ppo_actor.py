"""FSDPPPOActor in one process: step-0 invariants, GRPO advantages, minibatches, switches."""

from __future__ import annotations

import pytest
import torch

from arealite.api.config.actor import OptimizerConfig
from arealite.api.io_struct import FinetuneSpec
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs
from arealite.engine.ppo.actor import FSDPPPOActor
from arealite.utils.fsdp import full_state_dict
from tests.support.fsdp_helpers import actor_config, engine_config, random_trajectories

SPEC = FinetuneSpec(total_train_epochs=1, dataset_size=40, train_batch_size=4)


def _actor(path, **kw) -> FSDPPPOActor:
    a = FSDPPPOActor(actor_config(path, **kw), device="cpu", backend="gloo")
    a.initialize(ft_spec=SPEC)
    return a


def test_step0_invariants_and_plain_policy_gradient(tiny_model_dir):
    """behaviour = proximal = current logprobs: ratio 1, KL 0, no clipping, and the update
    equals the one from the plain policy-gradient loss -mean(A * logp)."""
    data = random_trajectories(6, seed=11, group_size=2)
    actor = _actor(tiny_model_dir, group_size=2, group_reward_norm=True, adv_norm=False,
                   c_clip=3.0, behav_imp_weight_cap=2.0)
    data["prox_logp"] = actor.compute_logp(data)
    data["logprobs"] = torch.where(data["loss_mask"], data["prox_logp"], 0.0)
    actor.compute_advantages(data)
    st = actor.ppo_update(data)
    assert st["importance_weight/min"] == pytest.approx(1.0, abs=1e-6)
    assert st["importance_weight/max"] == pytest.approx(1.0, abs=1e-6)
    assert abs(st["approx_kl/avg"]) < 1e-7 and abs(st["approx_kl/max"]) < 1e-6
    assert st["behave_imp_weight/avg"] == pytest.approx(1.0, abs=1e-6)
    assert abs(st["behave_approx_kl/avg"]) < 1e-7
    assert st["clip_ratio"] == 0.0 and st["dual_clip_ratio"] == 0.0
    assert st["behave_mask_ratio"] == 1.0 and st["update_successful"] == 1.0
    assert st["entropy/avg"] > 0

    pg = FSDPEngine(engine_config(tiny_model_dir), device="cpu", backend="gloo")
    pg.initialize(ft_spec=SPEC)
    batch = {k: v for k, v in data.items()}

    def pg_loss(logits, mb):
        lp = gather_logprobs(logits, mb["labels"])
        m = mb["loss_mask"].float()
        return -(mb["advantages"] * lp * m).sum() / m.sum()

    pg.train_batch(batch, pg_loss, lambda mb: mb["loss_mask"].sum())
    a, b = full_state_dict(actor.model), full_state_dict(pg.model)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-6, worst
    actor.destroy()
    pg.destroy()


@pytest.fixture(scope="module")
def grpo_actor(tiny_model_dir):
    a = _actor(tiny_model_dir, group_size=4, group_reward_norm=True, adv_norm=False,
               reward_bias=-0.5, reward_scaling=2.0, ppo_n_minibatches=2,
               optimizer=OptimizerConfig(lr=1e-3, lr_scheduler_type="linear"))
    yield a
    a.destroy()


def test_grpo_advantages_are_group_normalised_rewards(grpo_actor):
    data = random_trajectories(8, seed=12, group_size=4)
    data["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    data["prox_logp"] = grpo_actor.compute_logp(data)
    grpo_actor.compute_advantages(data)
    r = (data["rewards"] - 0.5) * 2.0
    for g in range(2):
        grp = r[4 * g : 4 * g + 4]
        norm = (grp - grp.mean()) / (grp.std(unbiased=False) + 1e-6)
        for k in range(4):
            b = 4 * g + k
            lm = data["loss_mask"][b]
            # gamma = lambda = 1, no KL: every generated token carries the sample's advantage
            assert torch.allclose(data["advantages"][b][lm], norm[k].expand(int(lm.sum())),
                                  atol=1e-5)
            assert (data["advantages"][b][~lm] == 0).all()


def test_workflow_formed_groups_use_their_baseline_not_consecutive_rows(grpo_actor):
    """AgentWorkflow's rows: 6 rows of 2 groups whose sessions gave 4 and 2 rows (a session's
    segments share its reward); group_size=4 is not used to cut them."""
    data = random_trajectories(6, seed=14, group_size=1)
    raw = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])  # group A: sessions 1, 1(2 rows), 0 ...
    base = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    scale = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    data |= {"rewards": raw, "group_baseline": base, "group_scale": scale}
    data["prox_logp"] = grpo_actor.compute_logp(data)
    grpo_actor.compute_advantages(data)
    # (r - b) / s with the same affine transform on r and b: (2(r-0.5) - 2(b-0.5)) / (2 s)
    want = (raw - base) / (scale + 1e-6 / 2.0)
    for b in range(6):
        lm = data["loss_mask"][b]
        assert torch.allclose(data["advantages"][b][lm], want[b].expand(int(lm.sum())), atol=1e-4)


def test_minibatches_step_the_optimizer_n_times_and_scheduler_once(grpo_actor):
    data = random_trajectories(8, seed=13, group_size=4)
    data["prox_logp"] = grpo_actor.compute_logp(data)
    grpo_actor.compute_advantages(data)
    step0 = grpo_actor.global_step
    lr0 = grpo_actor.optimizer.param_groups[0]["lr"]
    st = grpo_actor.ppo_update(data)
    assert grpo_actor.global_step - step0 == 2
    assert grpo_actor.lr_scheduler.last_epoch == 1  # stepped once per ppo_update
    assert grpo_actor.optimizer.param_groups[0]["lr"] < lr0
    # the second minibatch sees the weights moved by the first: ratio no longer exactly 1
    assert st["importance_weight/max"] > 1.0 or st["importance_weight/min"] < 1.0


def test_decoupled_loss_weights_stale_tokens(tiny_model_dir):
    data = random_trajectories(4, seed=14)
    actor = _actor(tiny_model_dir, behav_imp_weight_cap=1.5)
    data["prox_logp"] = actor.compute_logp(data)
    g = torch.Generator().manual_seed(0)
    data["logprobs"] = torch.where(
        data["loss_mask"], data["prox_logp"] + torch.randn(data["prox_logp"].shape, generator=g), 0.0)
    actor.compute_advantages(data)
    st = actor.ppo_update(data)
    assert st["importance_weight/avg"] == pytest.approx(1.0, abs=1e-6)  # vs proximal
    assert st["behave_imp_weight/max"] <= 1.5  # capped tokens are masked out
    assert 0.0 < st["behave_mask_ratio"] < 1.0
    assert abs(st["behave_approx_kl/avg"]) > 1e-3
    actor.destroy()


def test_switches_without_recompute_use_behaviour_logprobs(tiny_model_dir):
    data = random_trajectories(4, seed=15)
    actor = _actor(tiny_model_dir, recompute_logprob=False, use_decoupled_loss=False)
    with pytest.raises(KeyError, match="compute_advantages"):
        actor.ppo_update(dict(data))
    actor.compute_advantages(data)
    st = actor.ppo_update(data)
    # the random behaviour logprobs are far from the model's: ratio vs behaviour is not 1
    assert abs(st["importance_weight/avg"] - 1.0) > 1e-3
    assert "behave_imp_weight/avg" not in st
    actor.destroy()


def test_mask_no_eos_and_missing_inputs(tiny_model_dir):
    actor = _actor(tiny_model_dir, mask_no_eos_with_zero=True, group_size=1, adv_norm=False)
    data = random_trajectories(3, seed=16)
    data["rewards"] = torch.tensor([1.0, 1.0, 1.0])
    eos = actor.actor.eos_token_ids[0]
    last = data["attention_mask"].sum(1) - 1
    data["input_ids"][0, last[0]] = eos  # only sample 0 ended with EOS
    data["prox_logp"] = actor.compute_logp(data)
    actor.compute_advantages(data)
    assert data["shaped_rewards"].tolist() == [1.0, 0.0, 0.0]
    # kl_ctl == 0: the advantages do not read the proximal logprobs (the update may fuse them)
    actor.compute_advantages({k: v for k, v in data.items() if k != "prox_logp"})
    with pytest.raises(ValueError, match="groups"):
        _bad = _actor(tiny_model_dir, group_size=2)
        try:
            _bad.compute_advantages(random_trajectories(3, seed=1) | {"prox_logp": torch.zeros(1)})
        finally:
            _bad.destroy()
    actor.destroy()


def test_kl_against_a_frozen_reference(tiny_model_dir):
    actor = _actor(tiny_model_dir, kl_ctl=0.1, adv_norm=False)
    ref = FSDPPPOActor(actor_config(tiny_model_dir, optimizer=None), device="cpu", backend="gloo")
    ref.initialize()
    data = random_trajectories(4, seed=17)
    data["prox_logp"] = actor.compute_logp(data)
    data["ref_logp"] = ref.compute_logp(data)
    with pytest.raises(KeyError, match="prox_logp"):  # the KL term needs them
        actor.compute_advantages({k: v for k, v in data.items() if k != "prox_logp"})
    actor.compute_advantages(data)
    assert float(data["kl"].abs().max()) < 1e-6  # identical weights: no penalty yet
    actor.ppo_update(data)
    data = random_trajectories(4, seed=18)
    data["prox_logp"] = actor.compute_logp(data)
    data["ref_logp"] = ref.compute_logp(data)
    actor.compute_advantages(data)
    lm = data["loss_mask"]
    kl = data["kl"]
    assert torch.allclose(kl[lm], (data["prox_logp"] - data["ref_logp"])[lm], atol=1e-6)
    assert float(kl.abs().max()) > 1e-4
    # shaped token rewards: -kl_ctl * kl, plus the reward on the last generated token
    last = lm.float().cumsum(1).argmax(1)
    want = -0.1 * kl
    want[torch.arange(4), last] += data["rewards"]
    assert torch.allclose(data["token_rewards"], want, atol=1e-6)
    with pytest.raises(RuntimeError, match="no optimizer"):
        ref.train_batch(data, lambda lg, mb: lg.sum(), lambda mb: 1.0)
    ref.destroy()
    actor.destroy()

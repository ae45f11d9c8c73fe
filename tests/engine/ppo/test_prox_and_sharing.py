"""The trainer's shortcuts change nothing but the cost: the proximal logprobs taken from the
update's own forward, behaviour logprobs for current rows, shared-prompt packing and the
unsharded world of one give the weights and losses of the plain computation."""

from __future__ import annotations

import random

import pytest
import torch

from arealite.api.io_struct import FinetuneSpec
from arealite.api.trajectory import pad_sequences_to_tensors
from arealite.engine.ppo.actor import FSDPPPOActor
from arealite.observe.rollout_stats import batch_rollout_stats
from arealite.utils.fsdp import full_state_dict, load_full_state_dict
from tests.support.fsdp_helpers import actor_config

SPEC = FinetuneSpec(total_train_epochs=1, dataset_size=40, train_batch_size=4)
TOL = 1e-6


def _actor(path, **kw) -> FSDPPPOActor:
    kw.setdefault("group_size", 4)
    kw.setdefault("behav_imp_weight_cap", 5.0)
    a = FSDPPPOActor(actor_config(path, **kw), device="cpu", backend="gloo")
    a.initialize(ft_spec=SPEC)
    return a


def _groups(n_groups: int, group_size: int, seed: int, version: int = 0) -> dict:
    """GRPO groups: ``group_size`` rows per prompt, behaviour logprobs near the model's."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n_groups):
        prompt = [rng.randint(3, 299) for _ in range(rng.randint(3, 12))]
        for i in range(group_size):
            gen = [rng.randint(3, 299) for _ in range(rng.randint(1, 8))]
            rows.append({
                "input_ids": prompt + gen,
                "loss_mask": [0] * len(prompt) + [1] * len(gen),
                "logprobs": [0.0] * len(prompt) + [-rng.uniform(4.0, 7.0) for _ in gen],
                "versions": [-1] * len(prompt) + [version - (i % 2)] * len(gen),
                "rewards": float(rng.random() < 0.5),
            })
    return pad_sequences_to_tensors(rows)


def _copy_weights(src, dst) -> None:
    load_full_state_dict(dst.model, full_state_dict(src.model))


def _step(actor, data, fused: bool) -> dict:
    d = dict(data)
    if fused:
        assert actor.prepare_prox_logp(d) == "fused"
    else:
        d["prox_logp"] = actor.compute_logp(d)
    actor.compute_advantages(d)
    st = actor.ppo_update(d)
    if fused:  # the update's own forward gave every row's proximal logprobs
        assert d["prox_forwarded"].all()
    return {"stats": st, "prox": d["prox_logp"]}


def _capture_grads(actor) -> list[dict[str, torch.Tensor]]:
    """Record the gradients each optimizer step is given (Adam's first steps amplify float
    noise in tiny gradients, so the weights after a step are not the thing to compare)."""
    seen: list[dict[str, torch.Tensor]] = []
    step = actor.optimizer.step

    def recording_step(*args, **kwargs):
        seen.append({n: p.grad.detach().clone() for n, p in actor.model.named_parameters()})
        return step(*args, **kwargs)

    actor.optimizer.step = recording_step
    return seen


def _grad_rel_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) / (float(a[k].abs().max()) + 1e-12) for k in a)


def test_fused_prox_logp_and_shared_prompts_equal_the_plain_update(tiny_model_dir):
    data = _groups(3, 4, seed=5)
    plain = _actor(tiny_model_dir, shared_prompt_packing=False)
    fast = _actor(tiny_model_dir)  # defaults: fused proximal logprobs, shared prompts
    assert not plain.sharded and not fast.sharded  # a world of one in fp32: no FSDP
    assert fast.shares_prefixes and not plain.shares_prefixes
    ga, gb = _capture_grads(plain), _capture_grads(fast)
    for step in range(2):  # the second step: the proximal policy is no longer the behaviour's
        if step:  # the same starting weights, so that only the computation differs
            _copy_weights(plain, fast)
        a = _step(plain, data, fused=False)
        b = _step(fast, data, fused=True)
        lm = data["loss_mask"]
        assert float((a["prox"] - b["prox"])[lm].abs().max()) < TOL
        for k in ("loss", "grad_norm", "behave_imp_weight/avg", "behave_mask_ratio",
                  "entropy/avg", "importance_weight/max", "clip_ratio"):
            assert a["stats"][k] == pytest.approx(b["stats"][k], rel=1e-5, abs=1e-7), (step, k)
        assert _grad_rel_diff(ga[-1], gb[-1]) < 1e-5, step
    plain.destroy()
    fast.destroy()


def test_only_stale_rows_are_recomputed(tiny_model_dir):
    """Two minibatches: no fusion; rows wholly of the current version keep their behaviour
    logprobs, the others get the trainer's."""
    actor = _actor(tiny_model_dir, ppo_n_minibatches=2)
    actor.set_version(3)
    data = _groups(2, 4, seed=6, version=3)  # odd rows were generated at version 2
    how = actor.prepare_prox_logp(data)
    assert how == "recomputed:4"
    full = actor.compute_logp(data)
    lm = data["loss_mask"]
    for b in range(8):
        want = data["logprobs"][b] if b % 2 == 0 else full[b]
        assert float((data["prox_logp"][b] - want)[lm[b]].abs().max()) < TOL, b
    assert data["prox_forwarded"].tolist() == [b % 2 == 1 for b in range(8)]
    # the even rows are of the trainer's version but their prox_logp is a copy: no agreement
    # figure from them (it would read 0 whatever the server computed)
    assert "logprob_agreement/n_tokens" not in batch_rollout_stats(data, None, 4, 1.0)
    data["prox_forwarded"][0] = True  # were row 0 forwarded, its tokens would count
    got = batch_rollout_stats(data, None, 4, 1.0)
    assert got["logprob_agreement/n_tokens"] == float(lm[0].sum())
    data["prox_forwarded"][0] = False
    actor.compute_advantages(data)
    actor.ppo_update(data)
    with pytest.raises(KeyError, match="prox_logp"):  # two minibatches cannot fuse
        d = {k: v for k, v in data.items() if k != "prox_logp"}
        actor.compute_advantages(d)
        actor.ppo_update(d)
    actor.destroy()

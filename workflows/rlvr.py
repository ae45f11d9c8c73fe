"""RLVR: sample ``n_samples`` completions of one prompt, score each with a verifiable reward,
return the group as one trajectory (contract: ``arealite.api.trajectory``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import torch

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.engine_api import InferenceEngine
from arealite.api.io_struct import ModelRequest, ModelResponse
from arealite.api.reward_api import REWARD_FAILURE_POLICIES, check_reward_fn
from arealite.api.reward_model_api import RewardModelScorer
from arealite.api.trajectory import ROUTED_EXPERTS, pad_sequences_to_tensors, routed_experts_row
from arealite.api.workflow_api import RolloutWorkflow, generate_group
from workflows.dump import dump_samples
from workflows.prompting import (
    check_response,
    encode_prompt,
    sample_id,
    with_stop_tokens,
)
from workflows.reward_pool import compute_reward
from workflows.rewards.model import ModelRewardTerm


def trajectory_row(prompt_ids: list[int], resp: ModelResponse, reward: float, sid: Any = None,
                   n_trained: int | None = None) -> dict:
    """One trajectory row: the prompt (no loss, version -1) then the output, of which the first
    ``n_trained`` tokens (default: all) carry the loss."""
    n_in, n_out = len(prompt_ids), len(resp.output_tokens)
    k = n_out if n_trained is None else n_trained
    row = {
        "input_ids": list(prompt_ids) + list(resp.output_tokens),
        "loss_mask": [0] * n_in + [1] * k + [0] * (n_out - k),
        "logprobs": [0.0] * n_in + [float(x) for x in resp.output_logprobs],
        "versions": [-1] * n_in + [int(v) for v in resp.output_versions],
        "rewards": float(reward),
    }
    if sid is not None:
        row["sample_ids"] = sid
    if resp.routed_experts is not None:  # a mixture-of-experts server's routing, for replay
        row[ROUTED_EXPERTS] = routed_experts_row(resp.routed_experts, n_in + n_out)
    return row


class RLVRWorkflow(RolloutWorkflow):
    """One prompt -> ``gconfig.n_samples`` scored samples (a GRPO group).

    Args:
        reward_fn: ``reward_fn(prompt, completion, prompt_ids, completion_ids, **row) -> float``;
            runs in the shared reward pool (or inline when marked ``@inline_reward``).
        gconfig: sampling settings; ``n_samples`` requests of one sample each, sent together
            (``generate_group``: one batched call where the engine has one).
        tokenizer: an HF tokenizer (chat template, decode).
        reward_timeout: seconds per reward call before it fails (and is counted).
        reward_failure: what a failed reward call (raised, timed out, worker died) costs:
            ``"reject"`` (default) fails the episode, so it is not trained and the executor
            draws its prompt again; ``"zero"`` scores that sample 0 and trains on it.
        apply_chat_template / system_prompt / template_kwargs: how rows become prompts
            (``workflows.prompting.encode_prompt``); ``template_kwargs`` reach the template,
            e.g. ``{"enable_thinking": False}``. On by default: a ``prompt``/``question`` row
            becomes one user turn of the tokenizer's chat template; False tokenizes it as is.
        stop_on_pad: also stop at the tokenizer's pad token (EOS always stops); see
            ``workflows.prompting.with_stop_tokens``.
        dump_dir: when set, append each sample's text and reward under
            ``dump_dir/<version>/<id>.jsonl``.
        reward_model: a ``RewardModelScorer`` (the trainer passes its reward-model pool when
            ``reward_model`` is configured): each sample is scored as soon as it is generated
            and the score combined with ``reward_fn``'s (``workflows.rewards.model``).
        reward_model_combine: ``ModelRewardTerm`` settings: ``mode`` (``"sum"`` or ``"gate"``),
            ``model_weight``, ``rule_weight``, ``gate_fail`` (ignored without ``reward_model``).
    """

    def __init__(
        self,
        reward_fn: Callable[..., float],
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        *,
        reward_timeout: float = 15.0,
        reward_failure: str = "reject",
        apply_chat_template: bool = True,
        system_prompt: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        stop_on_pad: bool = True,
        dump_dir: str | None = None,
        reward_model: RewardModelScorer | None = None,
        reward_model_combine: dict[str, Any] | None = None,
    ):
        check_reward_fn(reward_fn)
        if not isinstance(gconfig, GenerationHyperparameters):
            raise TypeError(f"gconfig must be GenerationHyperparameters, got {type(gconfig).__name__}")
        if tokenizer is None:
            raise ValueError("RLVRWorkflow needs a tokenizer")
        if reward_timeout <= 0:
            raise ValueError("reward_timeout must be > 0")
        if reward_failure not in REWARD_FAILURE_POLICIES:
            raise ValueError(f"reward_failure must be one of {REWARD_FAILURE_POLICIES}, "
                             f"got {reward_failure!r}")
        self.reward_failure = reward_failure
        self.reward_fn = reward_fn
        self.gconfig = gconfig
        self.tokenizer = tokenizer
        self.reward_timeout = float(reward_timeout)
        self.apply_chat_template = apply_chat_template
        self.system_prompt = system_prompt
        self.template_kwargs = dict(template_kwargs or {})
        self.dump_dir = dump_dir
        self._sample_gconfig = with_stop_tokens(gconfig, tokenizer, stop_on_pad)
        # reward_model_combine alone is unused: the trainer's evaluation workflow is built from
        # the same kwargs without the reward model (held-out scores stay the rule's)
        self.reward_model = (None if reward_model is None else
                             ModelRewardTerm(reward_model, **(reward_model_combine or {})))

    def encode(self, data: dict[str, Any]) -> tuple[list[int], str]:
        return encode_prompt(
            self.tokenizer, data, apply_chat_template=self.apply_chat_template,
            system_prompt=self.system_prompt, template_kwargs=self.template_kwargs,
        )

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    async def score(self, prompt: str, completion: str, prompt_ids: list[int],
                    completion_ids: list[int], data: dict[str, Any]) -> float:
        return await compute_reward(self.reward_fn, prompt, completion, prompt_ids,
                                    completion_ids, data, self.reward_timeout, self.reward_failure)

    async def arun_episode(
        self, engine: InferenceEngine, data: dict[str, Any]
    ) -> dict[str, torch.Tensor] | None:
        prompt_ids, prompt_text = self.encode(data)
        group = uuid.uuid4().hex
        # One rid per sample: concurrent requests must not share a rid on a real SGLang server.
        reqs = [
            ModelRequest(rid=f"{group}-{i}", input_ids=list(prompt_ids),
                         gconfig=self._sample_gconfig.model_copy(), metadata={"group": group})
            for i in range(self.gconfig.n_samples)
        ]
        if self.reward_model is None:
            # the group in one call where the engine can (a batched /generate)
            resps: list[ModelResponse] = await generate_group(engine, reqs)
            for req, resp in zip(reqs, resps):
                check_response(resp, req.rid)
            completions = [self.decode(r.output_tokens) for r in resps]
            rewards = await asyncio.gather(*(
                self.score(prompt_text, c, prompt_ids, r.output_tokens, data)
                for c, r in zip(completions, resps)
            ))
        else:
            resps, completions, rewards = await self._generate_and_score_each(
                engine, reqs, prompt_ids, prompt_text, data)
        sid = sample_id(data)
        rows = [trajectory_row(prompt_ids, resp, reward, sid) for resp, reward in zip(resps, rewards)]
        if self.dump_dir:
            await self._dump(data, group, prompt_text, completions, resps, rewards)
        return pad_sequences_to_tensors(rows)

    async def _generate_and_score_each(self, engine, reqs, prompt_ids, prompt_text, data):
        """With a reward model: each sample is scored as soon as it is generated, while the
        group's other samples still generate (the model's score takes longer than a rule's)."""

        async def sample(req: ModelRequest) -> tuple[ModelResponse, str, float]:
            resp = await engine.agenerate(req)
            check_response(resp, req.rid)
            text = self.decode(resp.output_tokens)
            reward = await self.score(prompt_text, text, prompt_ids, resp.output_tokens, data)
            reward = await self.reward_model.combine(
                list(prompt_ids) + list(resp.output_tokens), reward, self.reward_failure)
            return resp, text, reward

        done = await asyncio.gather(*(sample(r) for r in reqs))
        return [d[0] for d in done], [d[1] for d in done], [d[2] for d in done]

    async def _dump(self, data, group, prompt_text, completions, resps, rewards) -> None:
        versions = [v for r in resps for v in r.output_versions]
        version = max(versions) if versions else -1
        qid = sample_id(data)
        records = [
            {"prompt": prompt_text, "completion": c, "reward": float(rw), "stop_reason": r.stop_reason,
             "n_tokens": len(r.output_tokens)}
            for c, r, rw in zip(completions, resps, rewards)
        ]
        await dump_samples(self.dump_dir, version, str(qid if qid is not None else group), records)

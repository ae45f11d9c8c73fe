"""Multi-turn RLVR: after a wrong answer the conversation gets a feedback message and the model
tries again, up to ``max_turns``.

Stitching is done on token ids: each turn's prompt is exactly the previous prompt + the tokens
the model generated + the feedback tokens, so nothing is decoded and re-encoded (no drift between
what was sampled and what is trained). Feedback tokens (and the prompt) have ``loss_mask`` 0,
logprob 0 and version -1. All turns of a sample share one rid, so a rid-sticky client keeps them
on one server (whose prefix cache then holds the conversation). The reward is that of the last
turn times ``turn_discount ** (turns - 1)``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import torch

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.engine_api import InferenceEngine
from arealite.api.io_struct import ModelRequest
from arealite.api.trajectory import (
    ROUTED_EXPERTS,
    join_routed_experts,
    pad_sequences_to_tensors,
    routed_experts_row,
)
from workflows.dump import dump_samples
from workflows.prompting import check_response, encode_text, render_chat, sample_id
from workflows.rlvr import RLVRWorkflow

DEFAULT_FEEDBACK = "Your answer is wrong. Please try again."


def feedback_token_ids(tokenizer: Any, feedback: str, **template_kwargs: Any) -> tuple[list[int], list[int]]:
    """Token ids that close the assistant turn, add ``feedback`` as a user turn and open the next
    assistant turn, derived from the chat template by rendering a conversation with and without
    the feedback. Returns (ids to append after an EOS, ids to append after a truncated turn)."""
    marker = "ASSISTANT_REPLY_MARKER"
    base = [{"role": "user", "content": "question"}, {"role": "assistant", "content": marker}]
    t1 = render_chat(tokenizer, base, add_generation_prompt=False, **template_kwargs)
    t2 = render_chat(tokenizer, base + [{"role": "user", "content": feedback}],
                     add_generation_prompt=True, **template_kwargs)
    if not t2.startswith(t1) or marker not in t1:
        raise ValueError("cannot derive feedback tokens: the chat template re-renders earlier turns")
    close = t1[t1.rindex(marker) + len(marker):]  # e.g. "<|im_end|>\n"
    opening = t2[len(t1):]  # e.g. "<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n"
    eos = tokenizer.eos_token or ""
    after_eos = close[len(eos):] if eos and close.startswith(eos) else close
    return encode_text(tokenizer, after_eos + opening), encode_text(tokenizer, close + opening)


class MultiTurnWorkflow(RLVRWorkflow):
    """RLVR with retries: ``max_turns`` attempts per sample, feedback after each wrong one.

    A turn counts as correct when its reward is ``>= success_threshold``. ``max_context_tokens``
    stops early when the next turn's prompt would not fit. Samples (``gconfig.n_samples``) run
    concurrently; each returns one row. Extra key: ``num_turns [B]``.
    """

    def __init__(
        self,
        reward_fn: Callable[..., float],
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        *,
        max_turns: int = 2,
        turn_discount: float = 0.9,
        feedback: str = DEFAULT_FEEDBACK,
        success_threshold: float = 1.0,
        max_context_tokens: int | None = None,
        **rlvr_kwargs: Any,
    ):
        super().__init__(reward_fn, gconfig, tokenizer, **rlvr_kwargs)
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        if not 0.0 <= turn_discount <= 1.0:
            raise ValueError("turn_discount must be in [0, 1]")
        if max_context_tokens is not None and max_context_tokens < 1:
            raise ValueError("max_context_tokens must be >= 1")
        self.max_turns = int(max_turns)
        self.turn_discount = float(turn_discount)
        self.success_threshold = float(success_threshold)
        self.max_context_tokens = max_context_tokens
        self.feedback_after_eos, self.feedback_after_cut = feedback_token_ids(
            tokenizer, feedback, **self.template_kwargs)

    async def _one_sample(self, engine: InferenceEngine, data: dict[str, Any], prompt_ids: list[int],
                          prompt_text: str, rid: str) -> dict[str, Any]:
        seq = list(prompt_ids)
        loss_mask, logprobs, versions = [0] * len(seq), [0.0] * len(seq), [-1] * len(seq)
        reward, turns = 0.0, 0
        routed = None  # a MoE server's routing: each turn's rows past those of earlier turns
        eos = self.tokenizer.eos_token_id
        while True:
            req = ModelRequest(rid=rid, input_ids=list(seq), gconfig=self._sample_gconfig.model_copy(),
                               metadata={"turn": turns})
            resp = await engine.agenerate(req)
            check_response(resp, rid)
            turns += 1
            if resp.routed_experts is not None:
                routed = join_routed_experts(routed, resp.routed_experts)
            out = list(resp.output_tokens)
            seq += out
            loss_mask += [1] * len(out)
            logprobs += [float(x) for x in resp.output_logprobs]
            versions += [int(v) for v in resp.output_versions]
            reward = await self.score(prompt_text, self.decode(out), prompt_ids, out, data)
            if reward >= self.success_threshold or turns >= self.max_turns:
                break
            fb = self.feedback_after_eos if out and out[-1] == eos else self.feedback_after_cut
            if self.max_context_tokens and len(seq) + len(fb) + 1 > self.max_context_tokens:
                break
            seq += fb
            loss_mask += [0] * len(fb)
            logprobs += [0.0] * len(fb)
            versions += [-1] * len(fb)
        row = {"input_ids": seq, "loss_mask": loss_mask, "logprobs": logprobs, "versions": versions,
               "rewards": float(reward) * self.turn_discount ** (turns - 1), "num_turns": turns}
        sid = sample_id(data)
        if sid is not None:
            row["sample_ids"] = sid
        if routed is not None:  # feedback appended after the last turn has no routing: -1
            full = routed_experts_row(routed, len(routed) + 1)
            row[ROUTED_EXPERTS] = torch.nn.functional.pad(full, (0, 0, 0, len(seq) - len(full)), value=-1)
        return row

    async def arun_episode(
        self, engine: InferenceEngine, data: dict[str, Any]
    ) -> dict[str, torch.Tensor] | None:
        prompt_ids, prompt_text = self.encode(data)
        group = uuid.uuid4().hex
        rows = await asyncio.gather(*(
            self._one_sample(engine, data, prompt_ids, prompt_text, f"{group}-{i}")
            for i in range(self.gconfig.n_samples)
        ))
        if self.dump_dir:
            version = max((v for r in rows for v in r["versions"]), default=-1)
            records = [{"conversation": self.tokenizer.decode(r["input_ids"]), "reward": r["rewards"],
                        "num_turns": r["num_turns"]} for r in rows]
            sid = sample_id(data)
            await dump_samples(self.dump_dir, version, str(sid if sid is not None else group), records)
        return pad_sequences_to_tensors(list(rows))

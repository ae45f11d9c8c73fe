"""A long-tailed RLVR workload for the async-vs-sync benchmark.

Real reasoning rollouts are long-tailed: most samples are short, a few run to the length limit.
The toy task's answers are ~5 tokens, so this workflow makes the tail honestly, by generation:
a fixed fraction of samples is sent with ``ignore_eos`` and a larger ``max_new_tokens``, so the
server really decodes (and the trainer really runs forward/backward over) that many tokens.
Nothing sleeps.

Which samples are long is a deterministic function of (seed, row id, sample index), so a sync
and an async run over the same data order get the same tail.

The reward and the loss only see a sample up to its first stop token: the text the policy would
have ended with anyway (sampling before EOS is unchanged by ``ignore_eos``). Tokens after it
stay in the sequence with ``loss_mask`` 0, so they cost generation and training compute without
teaching the model to babble; held-out accuracy is therefore comparable with the plain workflow.

Use it by import path: ``workflow.path=benchmarks.studies.longtail_workflow:LongTailRLVRWorkflow``,
``+workflow.kwargs.tail_fraction=0.1`` etc. (see ``benchmarks/studies/async_vs_sync.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Callable
from typing import Any

import torch

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.engine_api import InferenceEngine
from arealite.api.io_struct import ModelRequest, ModelResponse
from arealite.api.trajectory import pad_sequences_to_tensors
from workflows.prompting import check_response, sample_id
from workflows.rlvr import RLVRWorkflow, trajectory_row


def is_tail(seed: int, key: str, index: int, fraction: float) -> bool:
    """Deterministic Bernoulli(fraction) draw for sample ``index`` of the row named ``key``."""
    h = hashlib.blake2b(f"{seed}/{key}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64 < fraction


def first_stop(tokens: list[int], stop_ids: set[int]) -> int:
    """Length of the sample up to and including its first stop token (all of it if none)."""
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return i + 1
    return len(tokens)


class LongTailRLVRWorkflow(RLVRWorkflow):
    """``RLVRWorkflow`` where ``tail_fraction`` of the samples decode ``tail_max_new_tokens``
    tokens past EOS (see the module docstring). ``tail_fraction=0`` is the plain workflow."""

    def __init__(
        self,
        reward_fn: Callable[..., float],
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        *,
        tail_fraction: float = 0.1,
        tail_max_new_tokens: int = 128,
        tail_seed: int = 0,
        **kwargs: Any,
    ):
        super().__init__(reward_fn, gconfig, tokenizer, **kwargs)
        if not 0.0 <= tail_fraction <= 1.0:
            raise ValueError(f"tail_fraction must be in [0, 1], got {tail_fraction}")
        if tail_max_new_tokens < gconfig.max_new_tokens:
            raise ValueError(f"tail_max_new_tokens ({tail_max_new_tokens}) must be >= "
                             f"gconfig.max_new_tokens ({gconfig.max_new_tokens})")
        self.tail_fraction = float(tail_fraction)
        self.tail_seed = int(tail_seed)
        self.stop_ids = set(self._sample_gconfig.stop_token_ids)
        # The EOS/pad stops are what ignore_eos must skip; other stop ids would end the tail early.
        self._tail_gconfig = self._sample_gconfig.new(
            ignore_eos=True, max_new_tokens=int(tail_max_new_tokens), stop_token_ids=[])

    def _row_key(self, data: dict[str, Any], prompt_ids: list[int]) -> str:
        sid = sample_id(data)
        if sid is not None:
            return str(sid)
        return hashlib.blake2b(str(prompt_ids).encode(), digest_size=8).hexdigest()

    async def arun_episode(
        self, engine: InferenceEngine, data: dict[str, Any]
    ) -> dict[str, torch.Tensor] | None:
        prompt_ids, prompt_text = self.encode(data)
        key = self._row_key(data, prompt_ids)
        group = uuid.uuid4().hex
        reqs = []
        for i in range(self.gconfig.n_samples):
            tail = self.tail_fraction > 0 and is_tail(self.tail_seed, key, i, self.tail_fraction)
            g = self._tail_gconfig if tail else self._sample_gconfig
            reqs.append(ModelRequest(rid=f"{group}-{i}", input_ids=list(prompt_ids),
                                     gconfig=g.model_copy(), metadata={"group": group}))
        resps: list[ModelResponse] = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
        for req, resp in zip(reqs, resps):
            check_response(resp, req.rid)
        kept = [first_stop(r.output_tokens, self.stop_ids) for r in resps]
        completions = [self.decode(r.output_tokens[:k]) for r, k in zip(resps, kept)]
        rewards = await asyncio.gather(*(
            self.score(prompt_text, c, prompt_ids, r.output_tokens[:k], data)
            for c, r, k in zip(completions, resps, kept)
        ))
        sid = sample_id(data)
        rows = [trajectory_row(prompt_ids, resp, reward, sid, k)
                for resp, k, reward in zip(resps, kept, rewards)]
        if self.dump_dir:
            await self._dump(data, group, prompt_text, completions, resps, rewards)
        return pad_sequences_to_tensors(rows)

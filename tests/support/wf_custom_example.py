"""A user-style custom workflow living in a test module, loaded by import path in tests.
It takes no reward_fn: its reward is how close the completion's length is to a target."""

from __future__ import annotations

import asyncio
import uuid

from arealite.api.io_struct import ModelRequest
from arealite.api.trajectory import pad_sequences_to_tensors
from arealite.api.workflow_api import RolloutWorkflow


class TargetLengthWorkflow(RolloutWorkflow):
    def __init__(self, gconfig, tokenizer, target_len: int = 4):
        self.gconfig, self.tokenizer, self.target_len = gconfig, tokenizer, target_len

    async def arun_episode(self, engine, data):
        ids = self.tokenizer(data["question"], add_special_tokens=False)["input_ids"]
        g = self.gconfig.new(n_samples=1)
        resps = await asyncio.gather(*(
            engine.agenerate(ModelRequest(rid=uuid.uuid4().hex, input_ids=list(ids), gconfig=g))
            for _ in range(self.gconfig.n_samples)))
        rows = [{
            "input_ids": ids + r.output_tokens,
            "loss_mask": [0] * len(ids) + [1] * len(r.output_tokens),
            "logprobs": [0.0] * len(ids) + list(r.output_logprobs),
            "versions": [-1] * len(ids) + list(r.output_versions),
            "rewards": -float(abs(len(r.output_tokens) - self.target_len)),
        } for r in resps]
        return pad_sequences_to_tensors(rows)


class NotAWorkflow:
    pass

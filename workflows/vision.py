"""RLVR over images: a row's question and images -> ``gconfig.n_samples`` scored samples from a
vision-language model, as one trajectory carrying what the trainer needs for the images.

The prompt is built by the model's processor (``arealite.api.vision_io.encode_vision_prompt``:
``AutoProcessor``, or ``arealite.engine.vision_processor.load_processor`` without torchvision). The
request sends the expanded ids with the images (``ModelRequest.image_data``: base64 PNG, so
servers on other hosts need no shared file system). Each trajectory row adds the image keys of
``arealite.api.vision_io`` to the RLVR keys (``workflows.rlvr``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import uuid
from collections.abc import Callable
from typing import Any

import torch

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.engine_api import InferenceEngine
from arealite.api.io_struct import ModelRequest, ModelResponse
from arealite.api.reward_api import REWARD_FAILURE_POLICIES, check_reward_fn
from arealite.api.trajectory import pad_sequences_to_tensors
from arealite.api.vision_io import encode_vision_prompt, image_keys
from arealite.api.workflow_api import RolloutWorkflow
from workflows.prompting import check_response, sample_id, with_stop_tokens
from workflows.reward_pool import compute_reward
from workflows.rlvr import trajectory_row


def _png_base64(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


class VisionRLVRWorkflow(RolloutWorkflow):
    """One row (``question`` text plus ``images``) -> a GRPO group of scored samples.

    Args:
        reward_fn: ``reward_fn(prompt, completion, prompt_ids, completion_ids, **row) -> float``.
        gconfig: sampling settings; ``n_samples`` requests of one sample each run concurrently.
        processor: the model's processor (chat template, image processor, tokenizer).
        image_key / question_key: the row's keys for its list of images (paths or PIL images)
            and its question.
        system_prompt: an optional system turn.
        reward_timeout / reward_failure: as in ``RLVRWorkflow``.
    """

    def __init__(
        self,
        reward_fn: Callable[..., float],
        gconfig: GenerationHyperparameters,
        processor: Any,
        *,
        image_key: str = "images",
        question_key: str = "question",
        system_prompt: str | None = None,
        reward_timeout: float = 15.0,
        reward_failure: str = "reject",
    ):
        check_reward_fn(reward_fn)
        if not isinstance(gconfig, GenerationHyperparameters):
            raise TypeError(f"gconfig must be GenerationHyperparameters, got {type(gconfig).__name__}")
        if processor is None or not hasattr(processor, "image_processor"):
            raise ValueError("VisionRLVRWorkflow needs the model's processor (with an image processor)")
        if reward_failure not in REWARD_FAILURE_POLICIES:
            raise ValueError(f"reward_failure must be one of {REWARD_FAILURE_POLICIES}")
        if reward_timeout <= 0:
            raise ValueError("reward_timeout must be > 0")
        self.reward_fn = reward_fn
        self.gconfig = gconfig
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.image_key, self.question_key = image_key, question_key
        self.system_prompt = system_prompt
        self.reward_timeout = float(reward_timeout)
        self.reward_failure = reward_failure
        self.image_token_id = int(self.tokenizer.convert_tokens_to_ids(processor.image_token))
        self._sample_gconfig = with_stop_tokens(gconfig, self.tokenizer, True)

    def encode(self, data: dict[str, Any]) -> tuple[list[int], str, dict]:
        """Prompt ids (image placeholders expanded), its text and the processor's output."""
        images = data.get(self.image_key) or []
        if not images:
            raise ValueError(f"row has no images under {self.image_key!r}")
        return encode_vision_prompt(self.processor, data[self.question_key], images,
                                    self.system_prompt)

    async def arun_episode(self, engine: InferenceEngine, data: dict[str, Any]
                           ) -> dict[str, torch.Tensor] | None:
        prompt_ids, prompt_text, enc = self.encode(data)
        image_data = [_png_base64(img) for img in enc["images"]]
        group = uuid.uuid4().hex
        reqs = [
            ModelRequest(rid=f"{group}-{i}", input_ids=list(prompt_ids), image_data=image_data,
                         gconfig=self._sample_gconfig.model_copy(), metadata={"group": group})
            for i in range(self.gconfig.n_samples)
        ]
        resps: list[ModelResponse] = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
        for req, resp in zip(reqs, resps):
            check_response(resp, req.rid)
        completions = [self.tokenizer.decode(r.output_tokens, skip_special_tokens=True) for r in resps]
        row_data = {k: v for k, v in data.items() if k != self.image_key}
        rewards = await asyncio.gather(*(
            compute_reward(self.reward_fn, prompt_text, c, prompt_ids, r.output_tokens, row_data,
                           self.reward_timeout, self.reward_failure)
            for c, r in zip(completions, resps)
        ))
        sid = sample_id(data)
        rows = [trajectory_row(prompt_ids, resp, reward, sid) for resp, reward in zip(resps, rewards)]
        traj = pad_sequences_to_tensors(rows)
        return {**traj, **image_keys([enc] * len(rows), self.image_token_id, traj["input_ids"])}

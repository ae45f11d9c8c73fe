"""Supervised fine-tuning: next-token loss on the completion tokens of prompt/completion pairs.

Used to warm-start the toy task's policy before GRPO. Rows become the same padded trajectory
dict the RL path uses (``input_ids``, ``attention_mask``, ``loss_mask`` True on the completion,
including its EOS), so packing and micro-batching are shared with the PPO actor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from arealite.api.config.actor import TrainEngineConfig
from arealite.api.engine_api import TrainEngine
from arealite.api.trajectory import TensorDict, pad_sequences_to_tensors
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs, greedy_tokens


def sft_loss_fn(logits: torch.Tensor, mb: TensorDict) -> torch.Tensor:
    """Mean negative log-likelihood of the ``loss_mask`` tokens of a packed micro-batch."""
    m = mb["loss_mask"].bool()
    lp = gather_logprobs(logits, mb["labels"], mask=m)
    return -torch.where(m, lp, 0.0).sum() / m.sum().clamp_min(1)


def build_sft_batch(
    tokenizer: Any,
    prompts: Sequence[str],
    completions: Sequence[str],
    max_length: int | None = None,
    use_chat_template: bool = True,
) -> TensorDict:
    """Tokenise pairs into a padded batch; ``loss_mask`` covers completion + EOS.

    With ``use_chat_template`` the prompt is a user turn followed by the assistant header (the
    same text the RL workflow sends to the servers), so SFT teaches exactly what GRPO samples.
    Rows longer than ``max_length`` are truncated from the end (their EOS is then lost).
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if not prompts:
        raise ValueError("no prompt/completion pairs")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id")
    rows = []
    for p, c in zip(prompts, completions):
        if use_chat_template:
            p_ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=True, add_generation_prompt=True
            )
            if isinstance(p_ids, dict) or hasattr(p_ids, "input_ids"):
                p_ids = p_ids["input_ids"]
        else:
            p_ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        c_ids = tokenizer(c, add_special_tokens=False)["input_ids"] + [eos]
        ids = list(p_ids) + list(c_ids)
        mask = [0] * len(p_ids) + [1] * len(c_ids)
        if max_length is not None:
            ids, mask = ids[:max_length], mask[:max_length]
        rows.append({"input_ids": ids, "loss_mask": mask})
    return pad_sequences_to_tensors(rows)


class LMEngine:
    """The SFT algorithm over any ``TrainEngine``."""

    def __init__(self, engine: TrainEngine):
        self.engine = engine

    def train_lm(self, data: TensorDict) -> dict[str, float]:
        """One optimizer step (token-mean loss over all ranks) and one scheduler step."""
        stats = self.engine.train_batch(data, sft_loss_fn, lambda mb: mb["loss_mask"].sum())
        self.engine.step_lr_scheduler()
        return stats

    @torch.no_grad()
    def evaluate_lm(self, data: TensorDict) -> float:
        """Token-mean NLL of the completion tokens, over all ranks."""
        return self._mean_nll(self.engine.forward(data), data["loss_mask"].bool())

    @torch.no_grad()
    def evaluate_lm_exact(self, data: TensorDict) -> tuple[float, float]:
        """``evaluate_lm``'s NLL and the share of rows whose greedy completion is the reference
        (teacher forced: the argmax at every completion position is the reference token), from
        one forward. Every rank holds every row: the share is this rank's."""
        both = self.engine.forward(data, post_hook=lambda logits, mb: torch.stack(
            [gather_logprobs(logits, mb["labels"]),
             (greedy_tokens(logits) == mb["labels"]).float()], dim=-1))
        m = data["loss_mask"].bool()
        exact = ((both[..., 1] > 0.5) | ~m).all(dim=1).float().mean().item()
        return self._mean_nll(both[..., 0], m), exact

    def _mean_nll(self, lp: torch.Tensor, m: torch.Tensor) -> float:
        t = torch.tensor([float(-lp[m].double().sum()), float(m.sum())], dtype=torch.float64)
        if dist.is_initialized():
            group = getattr(self.engine, "dp_group", None)
            dev = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
            t = t.to(dev)
            dist.all_reduce(t, group=group)
        return float(t[0] / t[1].clamp_min(1))


class FSDPLMEngine(FSDPEngine):
    """``FSDPEngine`` with ``train_lm`` / ``evaluate_lm``."""

    def __init__(self, config: TrainEngineConfig, device: str = "auto", backend: str = "auto",
                 seed: int = 1):
        super().__init__(config, device=device, backend=backend, seed=seed)
        self.lm = LMEngine(self)

    def train_lm(self, data: TensorDict) -> dict[str, float]:
        return self.lm.train_lm(data)

    def evaluate_lm(self, data: TensorDict) -> float:
        return self.lm.evaluate_lm(data)

    def evaluate_lm_exact(self, data: TensorDict) -> tuple[float, float]:
        return self.lm.evaluate_lm_exact(data)

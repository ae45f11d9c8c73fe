"""Reward-model training on the FSDP engine: a sequence-classification model (HF
``AutoModelForSequenceClassification`` with ``num_labels=1``, e.g. ``Qwen2ForSequenceClassification``)
scores a (prompt, completion) sequence with its head's output at the sequence's **last token**,
the pooling SGLang's ``--is-embedding`` servers use (``PoolingType.LAST``), so a trained model
scores the same on our servers, on SGLang and here.

The engine trains on packed micro-batches, where HF's own pooling (the rightmost non-pad token
of a row) would see one row holding many sequences. ``RewardModelEngine`` therefore returns the
head's per-token output ``[T, 1]`` (captured by a forward hook on the head), and the losses read
each sequence's last position from ``cu_seqlens``.

``RewardModelActor`` trains with the Bradley–Terry loss on interleaved ``[chosen_0, rejected_0,
chosen_1, ...]`` rows (``preference.batch.dpo_batch``). A pair may be split across micro-batches,
so an update is the preference actor's two passes (``actor.surrogate_update``): no-grad scores,
the batch loss's gradient per row, then the surrogate ``Σ c_i · r_i(θ)``.
"""

from __future__ import annotations

from typing import Any

import torch

from arealite.api.engine_api import TrainEngine
from arealite.api.io_struct import FinetuneSpec
from arealite.api.trajectory import TensorDict
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.ppo.policy_losses import packed_seq_ids
from arealite.engine.preference.actor import surrogate_update
from arealite.engine.preference.losses import bradley_terry_loss

HEAD = "score"  # transformers' name of the sequence-classification head (Qwen2, Llama, ...)


class RewardModelEngine(FSDPEngine):
    """An ``FSDPEngine`` whose model is a one-label sequence classifier; ``model_forward``
    returns the head's output at every packed position, ``[T, 1]``."""

    model_kind = "reward"

    def initialize(self, addr: str | None = None, ft_spec: FinetuneSpec | None = None) -> None:
        super().initialize(addr, ft_spec)
        try:
            head = self.model.get_submodule(HEAD)
        except AttributeError:
            raise ValueError(f"{type(self.model).__name__} has no '{HEAD}' head: not a "
                             "transformers sequence-classification model") from None
        self._head_out: list[torch.Tensor] = []
        head.register_forward_hook(lambda _m, _a, out: self._head_out.append(out))

    def model_forward(self, packed: TensorDict) -> torch.Tensor:
        if "expand_index" in packed:
            raise ValueError("reward models do not share prompt prefixes (prefix_group_size=1)")
        self._head_out.clear()
        super().model_forward(packed)  # the pooled [1, 1] output is for a single-sequence row
        return self._head_out.pop()[0]


def _end_positions(cu_seqlens: torch.Tensor) -> torch.Tensor:
    return cu_seqlens[1:].long() - 1


@torch.no_grad()
def sequence_scores(engine: TrainEngine, data: TensorDict) -> torch.Tensor:
    """Each row's score (the head at its last token), float64 ``[B]``. Rows need >= 2 tokens:
    the hook writes each sequence's score on all of its positions, and ``forward`` returns
    position 0 of a sequence at token 1."""
    def at_ends(out: torch.Tensor, mb: TensorDict) -> torch.Tensor:
        ids, _ = packed_seq_ids(mb["cu_seqlens"])
        return out[_end_positions(mb["cu_seqlens"]), 0][ids]

    lens = data["attention_mask"].sum(1)
    if bool((lens < 2).any()):
        raise ValueError("reward-model rows need at least 2 tokens (prompt and completion)")
    return engine.forward(data, post_hook=at_ends)[:, 1].double()


def _surrogate_loss(out: torch.Tensor, mb: TensorDict) -> torch.Tensor:
    """``Σ_rows coef · r_row / rows`` of a packed micro-batch (weighted by its row count)."""
    r = out[_end_positions(mb["cu_seqlens"]), 0]
    return (mb["pref_coef"].to(r.dtype) * r).sum() / max(len(r), 1)


class RewardModelActor:
    """Bradley–Terry updates and held-out statistics over a ``RewardModelEngine``."""

    def __init__(self, engine: TrainEngine, center_coef: float = 0.0):
        self.engine, self.center_coef = engine, center_coef

    def _batch(self, data: TensorDict) -> tuple[torch.Tensor, Any, dict[str, float]]:
        if data["attention_mask"].shape[0] % 2:
            raise ValueError("reward-model batches interleave chosen and rejected rows: an even "
                             "count")
        r = sequence_scores(self.engine, data)

        def batch_loss(x: torch.Tensor) -> torch.Tensor:
            return bradley_terry_loss(x[0::2], x[1::2], center_coef=self.center_coef).mean()

        rc, rr = r[0::2], r[1::2]
        stats = {"scores/chosen": float(rc.mean()), "scores/rejected": float(rr.mean()),
                 "scores/margin": float((rc - rr).mean()),
                 "scores/accuracy": float((rc > rr).double().mean())}
        return r, batch_loss, stats

    def train_step(self, data: TensorDict) -> dict[str, float]:
        """One optimizer step of the Bradley–Terry loss on interleaved pairs."""
        r, batch_loss, stats = self._batch(data)
        return {**surrogate_update(self.engine, data, r, batch_loss, _surrogate_loss), **stats}

    @torch.no_grad()
    def evaluate(self, data: TensorDict) -> dict[str, float]:
        r, batch_loss, stats = self._batch(data)
        return {"loss": float(batch_loss(r)), **stats}

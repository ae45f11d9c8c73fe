"""The rollout workflow interface: how a prompt becomes scored trajectories."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from arealite.api.engine_api import InferenceEngine


class RolloutWorkflow(abc.ABC):
    """Subclass this (in your own file) and name it in the config by import path.

    ``arun_episode`` runs on the executor's event loop, many at once: never block it (no
    ``time.sleep``, no heavy CPU work; rewards go through a process pool). It returns a
    trajectory dict following the contract in ``arealite.api.trajectory`` (padded ``[B, S]``
    ``input_ids``, ``attention_mask``, ``loss_mask``, ``logprobs``, ``versions`` and
    ``rewards [B]``), or ``None`` to reject the episode.
    """

    @abc.abstractmethod
    async def arun_episode(
        self, engine: InferenceEngine, data: dict[str, Any]
    ) -> dict[str, torch.Tensor] | None: ...

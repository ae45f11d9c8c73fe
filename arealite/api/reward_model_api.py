"""What a workflow needs from a reward model: scores of token sequences, awaited on the
workflow's own event loop while other episodes go on generating.

The client (``arealite.rollout.reward_model_client.RemoteRewardModelEngine``) scores through a
pool of servers started with ``--is-embedding``; workflows see only this interface (they import
``arealite.api`` alone).
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class RewardModelScorer(ABC):
    @abstractmethod
    async def ascore_batch(self, sequences: list[list[int]]) -> list[float]:
        """One score per sequence (prompt + completion token ids), in order; the sequences are
        scored concurrently (the servers batch them)."""

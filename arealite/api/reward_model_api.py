"""What a workflow needs from a reward model: scores of token sequences, awaited on the
workflow's own event loop while other episodes go on generating.

The client (``arealite.rollout.reward_model_client.RemoteRewardModelEngine``) scores through a
pool of servers started with ``--is-embedding``; workflows see only this interface (they import
``arealite.api`` alone).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

# The reward-model pool's addresses when the launcher started it (launcher.reward_model_servers);
# AREAL_LLM_SERVER_ADDRS names the generation pool.
RM_ADDRS_ENV = "AREAL_RM_SERVER_ADDRS"


class RewardModelScorer(ABC):
    @abstractmethod
    async def ascore_batch(self, sequences: list[list[int]]) -> list[float]:
        """One score per sequence (prompt + completion token ids), in order; the sequences are
        scored concurrently (the servers batch them)."""

"""Combining a reward model's score with a rule reward (weighted sum, or the format gate) against
a loop, through ``ModelRewardTerm`` with an in-process scorer (a transformers forward of the tiny
reward model): the gate asks the model nothing for a sample that fails it, and a failed score is
counted and follows the workflow's ``reward_failure`` policy."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch

from arealite.api.reward_api import RewardFailed, reset_reward_stats, reward_stats
from arealite.api.reward_model_api import RewardModelScorer
from workflows.rewards.model import ModelRewardTerm, combine_rewards


class LocalScorer(RewardModelScorer):
    """Scores with a transformers forward in this process; longer sequences are refused."""

    def __init__(self, model_dir, max_len: int = 64):
        from transformers import AutoModelForSequenceClassification

        self.model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
        self.max_len, self.seen = max_len, []

    async def ascore_batch(self, sequences):
        self.seen += sequences
        out = []
        for s in sequences:
            if len(s) > self.max_len:
                raise ValueError(f"sequence of {len(s)} tokens is longer than {self.max_len}")
            with torch.no_grad():
                out.append(float(self.model(input_ids=torch.tensor([s])).logits[0, 0]))
        return out


@pytest.mark.parametrize("mode", ["sum", "gate"])
def test_combine_matches_loop(mode):
    for rule, score, mw, rw, fail in itertools.product([0.0, 1.0, 0.5], [-2.0, 0.3],
                                                        [1.0, 0.5], [1.0, 2.0], [-1.0, -3.0]):
        got = combine_rewards(rule, score, mode, mw, rw, fail)
        if mode == "sum":
            want = rw * rule + mw * score
        else:
            want = mw * score if rule > 0 else fail
        assert got == pytest.approx(want)
    with pytest.raises(ValueError, match="combine mode"):
        combine_rewards(1.0, 1.0, "product")


def test_term_scores_only_what_it_needs_and_handles_failures(tiny_reward_model_dir):
    scorer = LocalScorer(tiny_reward_model_dir)
    seq = [5, 6, 7, 8]
    with torch.no_grad():
        s = float(scorer.model(input_ids=torch.tensor([seq])).logits[0, 0])
    term = ModelRewardTerm(scorer, "sum", model_weight=0.5, rule_weight=2.0)
    assert asyncio.run(term.combine(seq, 1.0)) == pytest.approx(2.0 + 0.5 * s)
    gate = ModelRewardTerm(scorer, "gate", gate_fail=-4.0)
    scorer.seen.clear()
    assert asyncio.run(gate.combine(seq, 0.0)) == -4.0 and scorer.seen == []  # not asked
    assert asyncio.run(gate.combine(seq, 1.0)) == pytest.approx(s) and scorer.seen == [seq]
    reset_reward_stats()
    long = list(range(3, 100))
    with pytest.raises(RewardFailed, match="longer than 64"):
        asyncio.run(term.combine(long, 1.0))
    assert asyncio.run(term.combine(long, 1.0, reward_failure="zero")) == pytest.approx(2.0)
    assert reward_stats()["errors"] == 2
    with pytest.raises(ValueError, match="mode"):
        ModelRewardTerm(scorer, "max")
    with pytest.raises(TypeError, match="RewardModelScorer"):
        ModelRewardTerm(object())

"""Stop tokens of RLVR (#28): EOS always, pad beside it by default (as AReaL's RLVR client
sends), or not with ``stop_on_pad=False``; documented where users look."""

from __future__ import annotations

from pathlib import Path

from arealite.api.config.rollout import GenerationHyperparameters
from workflows.prompting import with_stop_tokens
from workflows.rewards.toy import toy_reward
from workflows.rlvr import RLVRWorkflow

DOCS = Path(__file__).parents[2] / "docs"


def test_pad_stops_by_default_and_can_be_turned_off(tiny_tokenizer):
    eos, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id
    assert eos != pad
    g = GenerationHyperparameters(n_samples=4, stop_token_ids=[7])
    assert with_stop_tokens(g, tiny_tokenizer).stop_token_ids == [7, eos, pad]
    assert with_stop_tokens(g, tiny_tokenizer, stop_on_pad=False).stop_token_ids == [7, eos]
    wf = RLVRWorkflow(toy_reward, g, tiny_tokenizer, stop_on_pad=False)
    assert wf._sample_gconfig.stop_token_ids == [7, eos]


def test_chat_template_and_stop_tokens_are_documented():
    for name in ("config.md", "custom_workflow.md"):
        text = (DOCS / name).read_text()
        assert "apply_chat_template" in text and "stop_on_pad" in text, name

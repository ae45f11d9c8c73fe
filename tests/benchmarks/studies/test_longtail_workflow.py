"""The long-tailed benchmark workflow: which samples are long, what reaches reward and loss."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.config.workflow import WorkflowConfig
from arealite.api.io_struct import ModelRequest, ModelResponse
from arealite.api.workflow_factory import build_workflow
from benchmarks.studies.longtail_workflow import LongTailRLVRWorkflow, first_stop, is_tail
from workflows.rewards.toy import toy_reward


class ScriptedEngine:
    """Answers '#### 12' then EOS; past EOS (ignore_eos) keeps writing '34' to the limit."""

    def __init__(self, tok):
        self.tok = tok
        self.answer = tok.encode("#### 12", add_special_tokens=False)
        self.junk = tok.encode("34", add_special_tokens=False)
        self.requests: list[ModelRequest] = []

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        self.requests.append(req)
        g = req.gconfig
        out = self.answer + [self.tok.eos_token_id]
        while g.ignore_eos and len(out) < g.max_new_tokens:
            out += self.junk
        out = out[: g.max_new_tokens]
        return ModelResponse(input_tokens=req.input_ids, output_tokens=out,
                             output_logprobs=[-0.5] * len(out), output_versions=[3] * len(out))


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_is_tail_is_deterministic_and_has_the_right_rate():
    draws = [is_tail(0, str(r), i, 0.1) for r in range(500) for i in range(8)]
    assert draws == [is_tail(0, str(r), i, 0.1) for r in range(500) for i in range(8)]
    assert 0.08 < sum(draws) / len(draws) < 0.12
    assert not any(is_tail(0, "a", i, 0.0) for i in range(100))
    assert all(is_tail(0, "a", i, 1.0) for i in range(100))
    assert [is_tail(1, "x", i, 0.5) for i in range(64)] != [is_tail(2, "x", i, 0.5) for i in range(64)]


def test_first_stop():
    assert first_stop([5, 6, 2, 7, 8], {2}) == 3
    assert first_stop([5, 6, 7], {2}) == 3
    assert first_stop([], {2}) == 0


def test_episode_long_tail_masks_after_eos_and_scores_the_answer(tok):
    g = GenerationHyperparameters(n_samples=8, max_new_tokens=10, temperature=1.0)
    wf = LongTailRLVRWorkflow(toy_reward, g, tok, tail_fraction=0.5, tail_max_new_tokens=40, tail_seed=3)
    eng = ScriptedEngine(tok)
    row = {"id": 7, "question": "What is 5 + 7?", "answer": "#### 12"}
    traj = asyncio.run(wf.arun_episode(eng, row))
    tails = [is_tail(3, "7", i, 0.5) for i in range(8)]
    assert 0 < sum(tails) < 8  # this seed gives both kinds
    n_ans = len(eng.answer) + 1
    for i, (req, long) in enumerate(zip(eng.requests, tails)):
        assert req.gconfig.ignore_eos is long
        assert req.gconfig.max_new_tokens == (40 if long else 10)
        assert (tok.eos_token_id in req.gconfig.stop_token_ids) is (not long)
        n_prompt = int((traj["loss_mask"][i] == 0).long().argmin())  # first generated position
        n_out = 40 if long else n_ans
        assert int(traj["attention_mask"][i].sum()) == n_prompt + n_out
        # loss only up to and including the first EOS; the rest is generated but not trained on
        assert int(traj["loss_mask"][i].sum()) == n_ans
        assert bool(traj["loss_mask"][i, n_prompt + n_ans - 1]) and not bool(traj["loss_mask"][i, n_prompt + n_ans:].any())
        assert (traj["versions"][i, n_prompt:n_prompt + n_out] == 3).all()
    # untruncated, the tail would read '#### 123434...' and score 0
    assert traj["rewards"].tolist() == [1.0] * 8


def test_built_by_import_path_and_checks_its_arguments(tok):
    g = GenerationHyperparameters(n_samples=2, max_new_tokens=10)
    cfg = WorkflowConfig(path="benchmarks.studies.longtail_workflow:LongTailRLVRWorkflow",
                         reward_fn="workflows.rewards.toy:toy_reward",
                         kwargs={"tail_fraction": 0.25, "tail_max_new_tokens": 64})
    wf = build_workflow(cfg, g, tok)
    assert isinstance(wf, LongTailRLVRWorkflow) and wf.tail_fraction == 0.25
    with pytest.raises(ValueError, match="tail_fraction"):
        LongTailRLVRWorkflow(toy_reward, g, tok, tail_fraction=1.5)
    with pytest.raises(ValueError, match="tail_max_new_tokens"):
        LongTailRLVRWorkflow(toy_reward, g, tok, tail_max_new_tokens=4)
    with pytest.raises(TypeError):
        LongTailRLVRWorkflow(toy_reward, g, tok, tail_length=4)

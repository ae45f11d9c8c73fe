import asyncio
import json

import pytest

from arealite.api.config.rollout import GenerationHyperparameters
from tests.support.wf_checks import assert_trajectory
from tests.support.wf_local_engine import ScriptedEngine
from workflows.math import MathRLVRWorkflow


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def gsm8k_row(gsm8k_fixture):
    rows = [json.loads(line) for line in open(gsm8k_fixture)]
    return {"id": 1, **rows[1]}  # 1,200 - 350 = 850


@pytest.mark.integration  # reward worker processes
def test_math_reward_with_format_term(tiny_model_dir, tiny_tokenizer, gsm8k_row, reward_pool_session):
    # only digits and a few words exist in the tiny tokenizer's vocabulary; that is all we need
    texts = ["1200 - 350 = 850\n#### 850<|im_end|>",    # right, right format
             "850<|im_end|>",                            # right answer, no '####' line
             "1200 - 350 = 950\n#### 950<|im_end|>"]     # wrong, right format
    eng = ScriptedEngine(str(tiny_model_dir), [_ids(tiny_tokenizer, t) for t in texts], version=1)
    g = GenerationHyperparameters(n_samples=3, max_new_tokens=64)
    wf = MathRLVRWorkflow(None, g, tiny_tokenizer, format_weight=0.25, format_style="gsm8k",
                          reward_timeout=60)
    traj = asyncio.run(wf.arun_episode(eng, dict(gsm8k_row)))
    assert_trajectory(traj, 3)
    # samples run concurrently and may take the scripts in any order: compare as a multiset
    assert sorted(traj["rewards"].tolist()) == [0.25, 1.0, 1.25]

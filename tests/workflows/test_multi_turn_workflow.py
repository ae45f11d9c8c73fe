import asyncio

import pytest

from arealite.api.config.rollout import GenerationHyperparameters
from tests.support.wf_checks import assert_trajectory
from tests.support.wf_local_engine import ScriptedEngine
from workflows.multi_turn import MultiTurnWorkflow, feedback_token_ids
from workflows.rewards.toy import toy_reward

ROW = {"id": 4, "question": "What is 3 + 4?", "answer": "3 + 4 = 7\n#### 7"}


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _wf(tok, n=1, max_new=32, **kw):
    return MultiTurnWorkflow(toy_reward, GenerationHyperparameters(n_samples=n, max_new_tokens=max_new),
                             tok, **kw)


def test_feedback_tokens_follow_the_chat_template(tiny_tokenizer):
    after_eos, after_cut = feedback_token_ids(tiny_tokenizer, "Wrong, try again.")
    assert tiny_tokenizer.decode(after_eos) == "\n<|im_start|>user\nWrong, try again.<|im_end|>\n<|im_start|>assistant\n"
    assert after_cut == [tiny_tokenizer.eos_token_id] + after_eos


def test_wrong_then_right_is_stitched_on_tokens(tiny_model_dir, tiny_tokenizer):
    tok = tiny_tokenizer
    wrong = _ids(tok, "3 + 4 = 8\n#### 8<|im_end|>")
    right = _ids(tok, "3 + 4 = 7\n#### 7<|im_end|>")
    eng = ScriptedEngine(str(tiny_model_dir), [wrong, right], version=2)
    wf = _wf(tok, max_turns=3, turn_discount=0.5)
    traj = asyncio.run(wf.arun_episode(eng, dict(ROW)))
    r1, r2 = eng.requests
    assert r1.rid == r2.rid  # one rid for all turns: the client keeps them on one server
    fb = wf.feedback_after_eos
    assert r2.input_ids == r1.input_ids + wrong + fb  # exactly, no re-tokenization
    p = len(r1.input_ids)
    assert_trajectory(traj, 1, [p])
    seq = traj["input_ids"][0]
    n = int(traj["attention_mask"][0].sum())
    assert seq[:n].tolist() == r2.input_ids + right
    lm, ver, lp = traj["loss_mask"][0, :n], traj["versions"][0, :n], traj["logprobs"][0, :n]
    fb_slice = slice(p + len(wrong), p + len(wrong) + len(fb))
    assert lm[p: p + len(wrong)].all() and lm[-len(right):].all()
    assert not lm[fb_slice].any() and (ver[fb_slice] == -1).all() and (lp[fb_slice] == 0).all()
    assert (ver[lm] == 2).all()
    assert traj["rewards"].tolist() == [0.5] and traj["num_turns"].tolist() == [2]
    assert traj["sample_ids"].tolist() == [4]


def test_right_first_time_and_never_right(tiny_model_dir, tiny_tokenizer):
    tok = tiny_tokenizer
    right = _ids(tok, "#### 7<|im_end|>")
    wrong = _ids(tok, "#### 1<|im_end|>")
    eng = ScriptedEngine(str(tiny_model_dir), [right] + [wrong] * 3)
    wf = _wf(tok, n=2, max_turns=3, turn_discount=0.9)
    traj = asyncio.run(wf.arun_episode(eng, dict(ROW)))
    # the two samples run concurrently; one got `right` first, the other three `wrong`s
    assert sorted(traj["num_turns"].tolist()) == [1, 3]
    by_turns = dict(zip(traj["num_turns"].tolist(), traj["rewards"].tolist()))
    assert by_turns == {1: 1.0, 3: 0.0}
    assert_trajectory(traj, 2)
    assert len({r.rid for r in eng.requests}) == 2


def test_truncated_turn_gets_closed_before_feedback(tiny_model_dir, tiny_tokenizer):
    tok = tiny_tokenizer
    cut = _ids(tok, "3 + 4 = 8 and")  # no EOS: the turn hit max_new_tokens
    eng = ScriptedEngine(str(tiny_model_dir), [cut, _ids(tok, "#### 7<|im_end|>")])
    wf = _wf(tok, max_new=len(cut), max_turns=2, turn_discount=0.9)
    traj = asyncio.run(wf.arun_episode(eng, dict(ROW)))
    r1, r2 = eng.requests
    assert r2.input_ids == r1.input_ids + cut + wf.feedback_after_cut
    assert traj["rewards"].tolist() == [pytest.approx(0.9)]


def test_max_context_stops_early(tiny_model_dir, tiny_tokenizer):
    tok = tiny_tokenizer
    wrong = _ids(tok, "#### 1<|im_end|>")
    eng = ScriptedEngine(str(tiny_model_dir), [wrong] * 3)
    wf = _wf(tok, max_turns=3, max_context_tokens=40)
    traj = asyncio.run(wf.arun_episode(eng, dict(ROW)))
    assert traj["num_turns"].tolist() == [1] and len(eng.requests) == 1


def test_live_tiny_model_multi_turn(local_engine, tiny_tokenizer):
    wf = _wf(tiny_tokenizer, n=2, max_new=6, max_turns=3)
    traj = asyncio.run(wf.arun_episode(local_engine, dict(ROW)))
    assert_trajectory(traj, 2)
    for b in range(2):
        turns = int(traj["num_turns"][b])
        # generated spans are separated by (turns - 1) feedback spans
        lm = traj["loss_mask"][b, : int(traj["attention_mask"][b].sum())].int()
        starts = int(((lm[1:] - lm[:-1]) == 1).sum())
        assert starts == turns


def test_bad_arguments(tiny_tokenizer):
    with pytest.raises(ValueError, match="max_turns"):
        _wf(tiny_tokenizer, max_turns=0)
    with pytest.raises(ValueError, match="turn_discount"):
        _wf(tiny_tokenizer, turn_discount=1.5)


class RoutedScriptedEngine(ScriptedEngine):
    """Each answer also carries routed experts (a MoE server's): every row holds its turn."""

    def _generate(self, req):
        resp = super()._generate(req)
        rows = len(req.input_ids) + len(resp.output_tokens) - 1
        import numpy as np

        resp.routed_experts = np.full((rows, 2), len(self.requests) - 1, dtype=np.int32)
        return resp


def test_routed_experts_of_later_turns_join_the_earlier_ones(tiny_model_dir, tiny_tokenizer):
    tok = tiny_tokenizer
    wrong = _ids(tok, "3 + 4 = 8\n#### 8<|im_end|>")
    right = _ids(tok, "3 + 4 = 7\n#### 7<|im_end|>")
    eng = RoutedScriptedEngine(str(tiny_model_dir), [wrong, right])
    traj = asyncio.run(_wf(tok, max_turns=3).arun_episode(eng, dict(ROW)))
    r1, r2 = eng.requests
    n = int(traj["attention_mask"][0].sum())
    routed = traj["routed_experts"][0, :n, 0].tolist()
    first = len(r1.input_ids) + len(wrong) - 1  # rows turn 1 reported: its tokens but the last
    # turn 1's rows stay (its tokens were generated with them); turn 2 adds the rest; the last
    # token has none
    assert routed == [0] * first + [1] * (n - 1 - first) + [-1]

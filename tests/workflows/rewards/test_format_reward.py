import pickle

import pytest

from workflows.rewards.format import FormatReward, check_format, format_reward


@pytest.mark.parametrize("text,style,ok", [
    ("reasoning <answer>42</answer>", "answer_tag", True),
    ("<answer> </answer>", "answer_tag", False),
    ("<answer>1</answer><answer>2</answer>", "answer_tag", False),
    ("<answer>1", "answer_tag", False),
    ("</answer>1<answer>", "answer_tag", False),
    ("<think>hmm</think>\n<answer>42</answer>", "think_answer", True),
    ("<think>hmm</think> extra <answer>42</answer>", "think_answer", False),
    ("<answer>42</answer><think>x</think>", "think_answer", False),
    ("<think></think><answer>42</answer>", "think_answer", False),
    ("2 + 2 = 4\n#### 4", "gsm8k", True),
    ("#### 1,234\n", "gsm8k", True),
    ("#### 4\nmore text", "gsm8k", False),
    ("the answer is \\boxed{\\frac{1}{2}}", "boxed", True),
    ("\\boxed{}", "boxed", False),
    ("\\boxed{1} and \\boxed{2}", "boxed", False),
    ("\\boxed{\\frac{1}{2}", "boxed", False),
    ("", "answer_tag", False),
])
def test_styles(text, style, ok):
    assert check_format(text, style) is ok
    assert format_reward("p", text, style=style) == float(ok)


def test_custom_tag_and_regex():
    assert format_reward("p", "<final>7</final>", tag="final") == 1.0
    assert format_reward("p", "ANSWER: 7", style="regex", pattern=r"ANSWER: \d+") == 1.0
    assert format_reward("p", "ANSWER: x", style="regex", pattern=r"ANSWER: \d+") == 0.0
    with pytest.raises(ValueError, match="style"):
        format_reward("p", "x", style="nope")
    with pytest.raises(ValueError, match="pattern"):
        FormatReward(style="regex")


def test_format_reward_object_is_picklable():
    f = pickle.loads(pickle.dumps(FormatReward(style="think_answer")))
    assert f("p", "<think>a</think><answer>b</answer>") == 1.0

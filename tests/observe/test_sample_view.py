"""A few of a step's samples on the console (#37): best and worst first, the prompt's end and
the reply decoded from the trajectory contract alone."""

from __future__ import annotations

from arealite.api.trajectory import pad_sequences_to_tensors
from arealite.observe.sample_view import format_samples, pick_rows


def test_pick_rows_against_a_slow_reference():
    for rewards in ([0.0], [1.0, 0.0, 0.5, 0.5], [0.2, 0.9, 0.1, 0.9, 0.3], []):
        for n in (1, 2, 3, 10):
            got = pick_rows(rewards, n)
            ranked = sorted(range(len(rewards)), key=lambda i: (-rewards[i], i))
            assert len(got) == min(n, len(rewards)) and len(set(got)) == len(got)
            if rewards:
                assert got[0] == ranked[0]  # the best first
                if n > 1 and len(rewards) > 1:
                    assert got[-1] == ranked[-1]  # the worst last
                    assert got[1:-1] == ranked[1:len(got) - 1]  # the next best between


class _CharTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 1))


def _row(prompt: str, reply: str, reward: float) -> dict:
    ids = [ord(c) for c in prompt + reply] + [1]  # 1: an end token, special
    n = len(prompt)
    return {"input_ids": ids, "attention_mask": [True] * len(ids),
            "loss_mask": [False] * n + [True] * (len(ids) - n), "rewards": reward}


def test_samples_show_prompt_end_reply_and_reward():
    rows = [_row("What is 2 + 3? ", "#### 5", 1.0), _row("What is 4 + 4? ", "Jddddd", 0.0),
            _row("x" * 100 + "? ", "y" * 300, 0.5)]
    batch = pad_sequences_to_tensors(rows)
    lines = format_samples(batch, _CharTokenizer(), step=10, n=2)
    assert lines == ["sample (step 10) reward 1.000 | 'What is 2 + 3? ' -> '#### 5'",
                     "sample (step 10) reward 0.000 | 'What is 4 + 4? ' -> 'Jddddd'"]
    long = format_samples(batch, _CharTokenizer(), step=1, n=3)[1]
    assert long.startswith("sample (step 1) reward 0.500 | '…" + "x" * 58 + "? ' -> 'yyy")
    assert long.endswith("y…'") and len(long) < 300
    assert format_samples(batch, _CharTokenizer(), step=1, n=0) == []
    assert format_samples({"rewards": batch["rewards"]}, _CharTokenizer(), step=1, n=2) == []

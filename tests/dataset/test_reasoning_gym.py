import json

import pytest

pytest.importorskip("reasoning_gym")

from arealite.dataset.reasoning_gym import (  # noqa: E402
    TaskSpec,
    UnknownTask,
    build_rows,
    parse_tasks,
    write_reasoning_gym,
)


def test_parse_tasks_forms_and_unknown_names():
    assert parse_tasks("chain_sum:2, leg_counting") == [
        TaskSpec("chain_sum", 2.0),
        TaskSpec("leg_counting"),
    ]
    assert parse_tasks({"gcd": 3}) == [TaskSpec("gcd", 3.0)]
    got = parse_tasks([{"name": "chain_sum", "config": {"max_terms": 3}}, "gcd"])
    assert got[0].config == {"max_terms": 3} and got[1] == TaskSpec("gcd")
    with pytest.raises(UnknownTask, match="closest: chain_sum") as e:
        parse_tasks("chain_sums")
    assert "\n" not in str(e.value)
    for bad in ("chain_sum:0", "gcd,gcd", ""):
        with pytest.raises(ValueError):
            parse_tasks(bad)


def test_splits_are_deterministic_disjoint_and_weighted(tmp_path):
    tasks = parse_tasks("chain_sum:3,leg_counting:1")
    a = write_reasoning_gym(tmp_path / "a", tasks, n_train=120, n_valid=40, seed=5)
    b = write_reasoning_gym(tmp_path / "b", tasks, n_train=120, n_valid=40, seed=5)
    assert a["train"].read_text() == b["train"].read_text()
    assert a["valid"].read_text() == b["valid"].read_text()
    train = [json.loads(x) for x in a["train"].read_text().splitlines()]
    valid = [json.loads(x) for x in a["valid"].read_text().splitlines()]
    assert len(train) == 120 and len(valid) == 40
    assert [r["id"] for r in train] == list(range(120))
    assert not {r["question"] for r in train} & {r["question"] for r in valid}
    assert len({r["question"] for r in train}) == 120
    share = sum(r["task"] == "chain_sum" for r in train) / len(train)
    assert 0.6 < share < 0.9  # weight 3:1
    other = build_rows(tasks, 40, seed=6, split="valid")
    assert [r["question"] for r in other] != [r["question"] for r in valid]


def test_rows_carry_the_tasks_prompt_and_config():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    (row,) = build_rows(
        [TaskSpec("chain_sum", 1.0, {"min_terms": 2, "max_terms": 2})],
        1,
        seed=0,
        split="valid",
        system_prompt="direct",
    )
    assert row["messages"][0] == {"role": "system", "content": SYSTEM_PROMPTS["direct"]}
    assert row["messages"][1] == {"role": "user", "content": row["question"]}
    assert row["task"] == "chain_sum" and row["task_config"] == {"min_terms": 2, "max_terms": 2}
    assert row["metadata"]["num_terms"] == 2
    with pytest.raises(ValueError, match="bad config"):
        build_rows([TaskSpec("chain_sum", 1.0, {"no_such_knob": 1})], 1)
    with pytest.raises(ValueError, match="system_prompt"):
        build_rows([TaskSpec("chain_sum")], 1, system_prompt="nope")


def test_a_prefilled_prompt_continues_the_assistant_turn(tiny_model_dir):
    from transformers import AutoTokenizer

    from workflows.prompting import encode_prompt

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    (row,) = build_rows([TaskSpec("gcd")], 1, seed=0, split="valid", answer_prefix="<answer>")
    ids, text = encode_prompt(tok, row)
    assert text.endswith("<answer>")  # continued, no end-of-turn after it
    (plain,) = build_rows([TaskSpec("gcd")], 1, seed=0, split="valid")
    _, plain_text = encode_prompt(tok, plain)
    assert text.startswith(plain_text)  # the generation prompt, then the prefix


def test_a_small_problem_space_repeats_in_train_never_in_held_out():
    tiny = [
        TaskSpec(
            "chain_sum", 1.0, {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
        )
    ]
    valid = build_rows(tiny, 40, seed=0, split="valid")
    train = build_rows(tiny, 600, seed=0, split="train", avoid={r["question"] for r in valid})
    distinct = {r["question"] for r in train}
    assert len(train) == 600 and len(distinct) < 600  # at most 200 such problems exist
    assert not distinct & {r["question"] for r in valid}
    with pytest.raises(ValueError, match="distinct valid problems"):
        build_rows(tiny, 600, seed=0, split="valid")


def test_few_shot_rows_show_solved_problems_of_the_task_and_never_a_held_out_one():
    task = [TaskSpec("chain_sum", 1.0, {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                         "max_digits": 1})]
    valid = build_rows(task, 30, seed=1, split="valid", system_prompt="direct",
                       answer_prefix="<answer>", shots=3)
    train = build_rows(task, 60, seed=1, split="train", system_prompt="direct",
                       avoid={r["question"] for r in valid}, answer_prefix="<answer>", shots=3)
    held_out = {r["question"] for r in valid}
    examples = set()
    for r in valid + train:
        m = r["messages"]
        assert [t["role"] for t in m] == ["system"] + ["user", "assistant"] * 4
        assert m[-2]["content"] == r["question"] and m[-1]["content"] == "<answer>"
        shots = [(m[i]["content"], m[i + 1]["content"]) for i in range(1, 7, 2)]
        for q, a in shots:
            assert q not in held_out and q != r["question"]
            assert a.startswith("<answer>") and a.endswith("</answer>")
        examples.add(tuple(shots))
    assert len(examples) > 10  # each row draws its own examples, not one fixed set
    # the same seed gives the same prompts; no shots gives the old zero-shot rows
    again = build_rows(task, 30, seed=1, split="valid", system_prompt="direct",
                       answer_prefix="<answer>", shots=3)
    assert again == valid
    plain = build_rows(task, 30, seed=1, split="valid", system_prompt="direct",
                       answer_prefix="<answer>")
    assert [len(r["messages"]) for r in plain] == [3] * 30
    assert [r["question"] for r in plain] == [r["question"] for r in valid]
    with pytest.raises(ValueError, match="shots"):
        build_rows(task, 2, seed=1, split="valid", shots=500)

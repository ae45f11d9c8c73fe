"""The calculator task: the tool, the splits, and SFT traces rendered with the chat template."""

from __future__ import annotations

import json

from arealite.demo.toy_tools import (
    TOOLS,
    calculate,
    generate_toy_tools,
    sft_rows,
    trace,
    write_toy_tools,
)


def test_calculator_computes_and_refuses_anything_else():
    assert calculate("47*8") == "376" and calculate("84 + 5 - 1") == "88"
    for bad in ("__import__('os')", "2**99999", "1/0", "x", None, "9" * 100):
        assert calculate(bad).startswith("error:")


def test_splits_are_disjoint_and_answers_right():
    train = generate_toy_tools(400, split="train")
    valid = generate_toy_tools(100, split="valid")
    assert not {r["question"] for r in train} & {r["question"] for r in valid}
    for r in train[:50]:
        a, b = r["question"][8:-1].split(" * ")
        assert r["answer"] == str(int(a) * int(b))


def test_traces_render_as_the_proxy_renders(tiny_tokenizer, tmp_path):
    row = generate_toy_tools(1)[0]
    rows = sft_rows(tiny_tokenizer, [row])
    assert len(rows) == 2  # the tool call, then the answer
    call = json.loads(rows[0]["completion"].split("\n")[1])
    assert call == {"name": "calc", "arguments": {"expr": row["question"][8:-1].replace(" * ", "*")}}
    assert rows[1]["completion"] == row["answer"]
    full = tiny_tokenizer.apply_chat_template(trace(row), tools=TOOLS, tokenize=False)
    assert full.startswith(rows[1]["prompt"] + row["answer"])
    paths = write_toy_tools(tmp_path, tiny_tokenizer, n_train=10, n_valid=5)
    assert sorted(paths) == ["sft_train", "sft_valid", "train", "valid"]
    assert len(paths["sft_train"].read_text().splitlines()) == 20

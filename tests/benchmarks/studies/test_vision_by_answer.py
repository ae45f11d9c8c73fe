"""benchmarks/studies/vision_by_answer.py: greedy completions equal a plain token-by-token argmax loop
over the full forward, and the tally splits the rows by answer and colour as scored by the
job's reward."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.studies.vision_by_answer import MAX_NEW_TOKENS, greedy_completions, main, tally


def _rows(toy_vision_dir: Path, n: int) -> list[dict]:
    return [json.loads(x) for x in (toy_vision_dir / "valid.jsonl").read_text().splitlines()][:n]


def test_greedy_completions_equal_a_plain_argmax_loop(tiny_vl_model_dir, toy_vision_dir):
    from transformers import AutoModelForImageTextToText

    from arealite.api.vision_io import encode_vision_prompt
    from arealite.engine.vision_processor import load_processor

    rows = _rows(toy_vision_dir, 3)
    got = greedy_completions(tiny_vl_model_dir, rows)
    model = AutoModelForImageTextToText.from_pretrained(str(tiny_vl_model_dir)).eval()
    proc = load_processor(tiny_vl_model_dir)
    eos = {proc.tokenizer.eos_token_id, proc.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    for row, text in zip(rows, got):
        ids, _, enc = encode_vision_prompt(proc, row["question"], row["images"])
        seq = list(ids)
        for _ in range(MAX_NEW_TOKENS):  # no cache: the whole sequence each step
            extra = {k: v for k, v in enc.items() if isinstance(v, torch.Tensor)
                     and k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
            mm = torch.zeros(1, len(seq), dtype=torch.long)
            mm[0, : len(ids)] = enc["mm_token_type_ids"][0] if "mm_token_type_ids" in enc else 0
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([seq]), mm_token_type_ids=mm, **extra).logits
            seq.append(int(logits[0, -1].argmax()))
            if seq[-1] in eos:
                break
        assert text == proc.tokenizer.decode(seq[len(ids):], skip_special_tokens=True)


def test_tally_splits_by_answer_and_colour():
    rows = [{"answer": "0", "colour": "red"}, {"answer": "2", "colour": "red"},
            {"answer": "2", "colour": "blue"}, {"answer": "1", "colour": "green"}]
    res = tally(rows, ["0", "There are 2", "3", "none"])
    assert res["accuracy"] == 0.5
    assert res["by_answer"] == {"0": [1, 1], "1": [0, 1], "2": [1, 2]}
    assert res["by_colour"] == {"blue": [0, 1], "green": [0, 1], "red": [2, 2]}


def test_cli_refuses_a_directory_without_a_processor(tmp_path, toy_vision_dir, capsys):
    assert main([str(toy_vision_dir / "valid.jsonl"), str(tmp_path)]) == 2
    assert "not a vision model directory" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.jsonl"), str(tmp_path)]) == 2

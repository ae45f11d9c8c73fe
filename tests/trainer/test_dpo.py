"""The DPO entry script end to end in one process on the tiny model: preference files built from
the toy task (chosen = the right answer, rejected = a wrong one); the preference loss and reward
accuracy it logs go from chance to fitted on the pairs it trains on (the randomly initialised
tiny model cannot generalise arithmetic to held-out problems: that needs an SFT start and is a
benchmark, not a unit test); KTO through the same script."""

from __future__ import annotations

import json

import pytest

from arealite.demo.toy_math import generate_toy_math, write_toy_preferences
from arealite.trainer import dpo


def _metrics(root) -> list[dict]:
    f = next(root.rglob("metrics.jsonl"))
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def _args(tmp_path, model, data_dir, *extra):
    return [f"model.path={model}", "model.dtype=float32", "model.max_tokens_per_mb=4096",
            "model.optimizer.lr=1e-3", "device=cpu", "dist_backend=gloo",
            f"cluster.fileroot={tmp_path}", f"train_dataset.path={data_dir}/train.jsonl",
            "train_dataset.batch_size=16", f"valid_dataset.path={data_dir}/valid.jsonl",
            "valid_dataset.batch_size=32", "valid_dataset.shuffle=false", "beta=0.5",
            "use_chat_template=false", "evaluator.freq_steps=100", "stats_logger.tensorboard=false",
            f"output_dir={tmp_path}/model", *extra]


def test_dpo_fits_the_preferences_it_trains_on(tmp_path, tiny_model_dir):
    data = tmp_path / "pref"
    write_toy_preferences(data, n_train=32, n_valid=8)
    (data / "valid.jsonl").write_text((data / "train.jsonl").read_text())  # evaluate on train
    assert dpo.main(_args(tmp_path, tiny_model_dir, data, "total_train_epochs=4",
                          "total_train_steps=8")) == 0
    m = _metrics(tmp_path)
    before, after = m[0], m[-1]
    print("dpo valid", {k: (before[k], after[k]) for k in ("valid/loss",
                                                          "valid/rewards/accuracy")})
    assert before["valid/loss"] == pytest.approx(0.693147, abs=1e-4)  # policy = reference
    assert after["valid/loss"] < 0.5 * before["valid/loss"]
    assert after["valid/rewards/accuracy"] >= 0.9 and after["valid/rewards/margin"] > 0.5
    assert (tmp_path / "model" / "config.json").is_file()


def test_kto_runs_through_the_same_script(tmp_path, tiny_model_dir):
    data = tmp_path / "kto"
    data.mkdir()
    for split in ("train", "valid"):  # evaluated on the rows it trains on, as above
        rows = []
        for r in generate_toy_math(16, split="train"):
            right = int(r["answer"].split("####")[-1])
            rows.append({"prompt": r["question"], "completion": r["answer"], "label": True})
            rows.append({"prompt": r["question"], "completion": f"#### {right + 3}",
                         "label": False})
        (data / f"{split}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert dpo.main(_args(tmp_path, tiny_model_dir, data, "loss_type=kto",
                          "total_train_epochs=3", "total_train_steps=6")) == 0
    m = _metrics(tmp_path)
    assert m[-1]["valid/loss"] < m[0]["valid/loss"] - 0.05
    assert m[-1]["valid/rewards/desirable"] > m[-1]["valid/rewards/undesirable"]
    assert m[-1]["valid/kto/reference_point"] >= 0.0


def test_bad_rows_name_the_missing_field(tmp_path, tiny_model_dir):
    data = tmp_path / "bad"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"prompt": "a", "chosen": "b"}) + "\n")
    (data / "valid.jsonl").write_text(json.dumps({"prompt": "a", "chosen": "b"}) + "\n")
    with pytest.raises(KeyError, match="no 'rejected' field"):
        dpo.main(_args(tmp_path, tiny_model_dir, data, "train_dataset.batch_size=1",
                       "train_dataset.drop_last=false"))

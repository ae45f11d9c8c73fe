"""The reward-model entry script end to end in one process on the tiny model, on the toy task's
preference files (the same builder as DPO): held-out pair loss and accuracy go from chance to
fitted on the pairs it trains on, and the saved model is a one-label sequence classifier."""

from __future__ import annotations

import json

import pytest

from arealite.demo.toy_math import write_toy_preferences
from arealite.trainer import reward_model


def _metrics(root) -> list[dict]:
    f = next(root.rglob("metrics.jsonl"))
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def test_reward_model_fits_the_preferences_it_trains_on(tmp_path, tiny_model_dir):
    data = tmp_path / "pref"
    write_toy_preferences(data, n_train=32, n_valid=8)
    (data / "valid.jsonl").write_text((data / "train.jsonl").read_text())  # evaluate on train
    args = [f"model.path={tiny_model_dir}", "model.dtype=float32", "model.optimizer.lr=1e-3",
            "device=cpu", "dist_backend=gloo", f"cluster.fileroot={tmp_path}",
            f"train_dataset.path={data}/train.jsonl", "train_dataset.batch_size=16",
            f"valid_dataset.path={data}/valid.jsonl", "valid_dataset.batch_size=32",
            "valid_dataset.shuffle=false", "use_chat_template=false", "evaluator.freq_steps=100",
            "stats_logger.tensorboard=false", f"output_dir={tmp_path}/rm",
            "total_train_epochs=10", "total_train_steps=20"]
    assert reward_model.main(args) == 0
    m = _metrics(tmp_path)
    before, after = m[0], m[-1]
    print("rm valid", {k: (before[k], after[k]) for k in ("valid/loss", "valid/scores/accuracy", "valid/scores/margin")})
    assert after["valid/loss"] < 0.6 * before["valid/loss"]
    assert after["valid/scores/accuracy"] >= 0.85 and after["valid/scores/margin"] > 0.5
    cfg = json.loads((tmp_path / "rm" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForSequenceClassification"]
    assert len(cfg["id2label"]) == 1


def test_bad_rows_name_the_missing_field(tmp_path, tiny_model_dir):
    data = tmp_path / "bad"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.jsonl").write_text(json.dumps({"prompt": "a", "chosen": "b"}) + "\n")
    with pytest.raises(KeyError, match="no 'rejected' field"):
        reward_model.main([f"model.path={tiny_model_dir}", f"cluster.fileroot={tmp_path}",
                           f"train_dataset.path={data}/train.jsonl", "device=cpu",
                           "train_dataset.batch_size=1", "train_dataset.drop_last=false",
                           f"valid_dataset.path={data}/valid.jsonl"])

"""The offline trainers' shared start: a ``total_train_steps`` cap is the run's length and the
end of its learning-rate schedule, which the engine reads from ``ft.total_train_steps`` (a
cosine over a capped SFT run used to decay over the uncapped epochs instead)."""

from __future__ import annotations

import json

from arealite.api.config.experiment import SFTConfig
from arealite.demo.tiny import TinyModelSpec, build_tiny_model
from arealite.trainer.offline_setup import start_offline_run


def test_total_train_steps_caps_the_run_and_its_schedule(tmp_path):
    model = tmp_path / "tiny"
    build_tiny_model(model, TinyModelSpec())
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i}+1", "completion": str(i + 1)}) + "\n"
                            for i in range(40)))
    base = [f"model.path={model}", f"train_dataset.path={rows}", "train_dataset.batch_size=4",
            "total_train_epochs=3", "device=cpu", f"cluster.fileroot={tmp_path}"]
    run = start_offline_run(["configs/toy_sft.yaml", *base, "valid_dataset=null",
                             "total_train_steps=7"], SFTConfig)
    assert (run.total_steps, run.ft.total_train_steps) == (7, 7)
    uncapped = start_offline_run(["configs/toy_sft.yaml", *base, "valid_dataset=null"], SFTConfig)
    assert (uncapped.total_steps, uncapped.ft.total_train_steps) == (30, 30)  # 3 epochs x 10

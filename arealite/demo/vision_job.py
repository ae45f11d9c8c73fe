"""The vision job (``arealite vision-job``, docs/vision.md): a vision-language model trained by
RL on CPU.

1. builds the tiny Qwen2-VL (``arealite tiny-model --vision``) and the toy visual counting task
   (``{fileroot}/vision_assets``) when missing;
2. warm-starts the policy by SFT on (image, question) -> answer rows, until held-out accuracy
   reaches the SFT config's ``stop_at_valid_accuracy``;
3. runs async GRPO (``configs/toy_vision_grpo.yaml``): ``VisionRLVRWorkflow`` sends each
   prompt's image to the embedded servers as SGLang's ``image_data``;
4. draws the reward and held-out accuracy curve.

Overrides (``key=value``) go to the GRPO config, e.g. ``arealite vision-job total_train_steps=10``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from arealite.demo.main_job import run_job

GRPO_CONFIG = "configs/toy_vision_grpo.yaml"
SFT_CONFIG = "configs/toy_vision_sft.yaml"


def build_assets(assets: Path) -> None:
    from arealite.demo.tiny import TinyModelSpec, build_tiny_model
    from arealite.demo.toy_vision import write_toy_vision

    if not (assets / "tiny_model" / "config.json").is_file():
        build_tiny_model(assets / "tiny_model", TinyModelSpec(vision=True))
    if not (assets / "toy_vision" / "valid.jsonl").is_file():
        write_toy_vision(assets / "toy_vision", n_train=3000, n_valid=500, seed=0)


def asset_overrides(assets: Path, model_key: str) -> list[str]:
    data = assets / "toy_vision"
    model = assets / ("tiny_model" if model_key == "model.path" else "sft_model")
    return [f"{model_key}={model}", f"train_dataset.path={data / 'train.jsonl'}",
            f"valid_dataset.path={data / 'valid.jsonl'}"]


def main(overrides: list[str] | None = None) -> int:
    return run_job(overrides, grpo_config=GRPO_CONFIG, sft_config=SFT_CONFIG,
                   assets_dir="vision_assets", build=build_assets, asset_args=asset_overrides,
                   sft_args=[], steps=("building the tiny Qwen2-VL and the visual counting task",
                                       "SFT warm start on images",
                                       "async GRPO on images ({backend} servers)"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The agent job (``arealite agent-job``, docs/agents.md): a calculator-calling agent trained on CPU.

1. builds a tiny model whose tokenizer knows tool-call text, the multiplication task and its
   rendered tool-call traces (``{fileroot}/agent_assets``) when missing;
2. warm-starts the policy by SFT on the traces (a fixed, short number of steps: the agent
   then often calls the tool with wrong operands or miscopies the result, leaving RL work);
3. runs async GRPO (``configs/toy_agent_grpo.yaml``): ``AgentWorkflow`` runs
   ``examples/tool_agent/agent.py`` (plain OpenAI-client code) against the agent proxy;
4. draws the reward and held-out accuracy curve.

Overrides (``key=value``) go to the GRPO config, e.g. ``arealite agent-job total_train_steps=10``;
those prefixed ``sft.`` to the SFT warm start (``sft.total_train_steps=120``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from arealite.demo.main_job import run_job

GRPO_CONFIG = "configs/toy_agent_grpo.yaml"
SFT_CONFIG = "configs/toy_agent_sft.yaml"


def build_assets(assets: Path) -> None:
    from transformers import AutoTokenizer

    from arealite.demo.tiny import TinyModelSpec, build_tiny_model
    from arealite.demo.toy_tools import write_toy_tools

    model = assets / "tiny_model"
    if not (model / "config.json").is_file():
        build_tiny_model(model, TinyModelSpec(corpus="toy_tools"))
    if not (assets / "toy_tools" / "sft_valid.jsonl").is_file():
        write_toy_tools(assets / "toy_tools", AutoTokenizer.from_pretrained(str(model)))


def asset_overrides(assets: Path, model_key: str) -> list[str]:
    data = assets / "toy_tools"
    if model_key == "model.path":  # SFT
        return [f"model.path={assets / 'tiny_model'}", f"train_dataset.path={data / 'sft_train.jsonl'}",
                f"valid_dataset.path={data / 'sft_valid.jsonl'}"]
    return [f"actor.path={assets / 'sft_model'}", f"train_dataset.path={data / 'train.jsonl'}",
            f"valid_dataset.path={data / 'valid.jsonl'}"]


def main(overrides: list[str] | None = None) -> int:
    return run_job(overrides, grpo_config=GRPO_CONFIG, sft_config=SFT_CONFIG,
                   assets_dir="agent_assets", build=build_assets, asset_args=asset_overrides,
                   sft_args=[], steps=("building the tiny model and the calculator task",
                                       "SFT warm start on tool-call traces",
                                       "async GRPO of the agent through the proxy"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The agent job (``arealite agent-job``, docs/agents.md): a calculator-calling agent trained on CPU.

1. builds a tiny model whose tokenizer knows tool-call text, the multiplication task and its
   rendered tool-call traces (``{fileroot}/agent_assets``) when missing;
2. warm-starts the policy by SFT on the traces (a fixed, short number of steps: the agent
   then often calls the tool with wrong operands or miscopies the result, leaving RL work);
3. runs async GRPO (``configs/toy_agent_grpo.yaml``): ``AgentWorkflow`` runs
   ``examples/tool_agent/agent.py`` (plain OpenAI-client code) against the agent proxy;
4. draws the reward and held-out accuracy curve.

Overrides (``key=value``) go to the GRPO config, e.g. ``arealite agent-job total_train_steps=10``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from arealite.api.config_loader import ConfigError, load_config

GRPO_CONFIG = "configs/toy_agent_grpo.yaml"
SFT_CONFIG = "configs/toy_agent_sft.yaml"


def build_assets(assets: Path) -> None:
    from transformers import AutoTokenizer

    from arealite.dataset.toy_tools import write_toy_tools
    from arealite.models.tiny import TinyModelSpec, build_tiny_model

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
    from arealite.launcher.local import main as launch
    from arealite.utils.stats_logger import plot_metrics

    try:
        fileroot = load_config(GRPO_CONFIG, list(overrides or [])).cluster.fileroot
        assets = Path(fileroot) / "agent_assets"
        overrides = asset_overrides(assets, "actor.path") + list(overrides or [])
        grpo = load_config(GRPO_CONFIG, overrides)
    except ConfigError as e:
        print(f"arealite: config error: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    print("== 1/3 building the tiny model and the calculator task", flush=True)
    build_assets(assets)
    sft_model = Path(grpo.actor.path)
    if not (sft_model / "config.json").is_file():
        print(f"== 2/3 SFT warm start on tool-call traces -> {sft_model}", flush=True)
        code = launch([SFT_CONFIG, *asset_overrides(assets, "model.path"),
                       f"cluster.fileroot={fileroot}", f"output_dir={sft_model}"])
        if code != 0:
            print(f"arealite: SFT warm start failed (exit {code})", file=sys.stderr)
            return code
    else:
        print(f"== 2/3 SFT warm start: reusing {sft_model}", flush=True)
    print("== 3/3 async GRPO of the agent through the proxy", flush=True)
    code = launch([GRPO_CONFIG, *overrides])
    out = grpo.run_dir()
    metrics = out / "logs" / "metrics.jsonl"
    if metrics.is_file():
        png = out / "reward_curve.png"
        plot_metrics(metrics, png, keys=["reward", "eval/accuracy"],
                     title=f"{grpo.experiment_name}/{grpo.trial_name}: reward, held-out accuracy")
        print(f"\nDone in {time.monotonic() - t0:.0f}s (exit {code}). Outputs:")
        print(f"  metrics:      {metrics}")
        print(f"  reward curve: {png}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The main job (``make run`` / ``arealite main-job``): the whole system on a 2-core CPU.

1. builds the tiny model and the toy task (``outputs/assets``) when missing;
2. warm-starts the policy with SFT, stopped while held-out accuracy is still low, so that RL
   has something to do;
3. runs async GRPO (``configs/toy_grpo.yaml``) through the local launcher: embedded servers and
   the FSDP2 trainer as separate processes, weights pushed over a gloo broadcast each step;
4. draws the reward curve and says where every output is.

Overrides (``key=value``) go to the GRPO config, e.g. ``arealite main-job total_train_steps=10``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from arealite.api.config_loader import ConfigError, load_config

GRPO_CONFIG = "configs/toy_grpo.yaml"
SFT_CONFIG = "configs/toy_sft.yaml"
# SFT stops once teacher-forced held-out accuracy reaches this; sampled greedy accuracy at GRPO
# step 0 is then well under 0.5, leaving the rise to RL.
SFT_STOP_ACCURACY = 0.3


def build_assets(assets: Path) -> None:
    from arealite.dataset.toy_math import write_toy_math
    from arealite.models.tiny import build_tiny_model

    if not (assets / "tiny_model" / "config.json").is_file():
        build_tiny_model(assets / "tiny_model")
    if not (assets / "toy_math" / "valid.jsonl").is_file():
        write_toy_math(assets / "toy_math", n_train=3000, n_valid=200, seed=0)


def ensure_sft_model(assets: Path, fileroot: str | Path, sft_model: Path | None = None) -> int:
    """The SFT warm start at ``sft_model`` (default ``assets/sft_model``), built through the
    launcher when missing; the launcher's exit status."""
    from arealite.launcher.local import main as launch

    sft_model = sft_model or assets / "sft_model"
    if (sft_model / "config.json").is_file():
        print(f"== 2/3 SFT warm start: reusing {sft_model}", flush=True)
        return 0
    print(f"== 2/3 SFT warm start -> {sft_model}", flush=True)
    return launch([SFT_CONFIG, *asset_overrides(assets, "model.path"), f"cluster.fileroot={fileroot}",
                   f"output_dir={sft_model}", f"stop_at_valid_accuracy={SFT_STOP_ACCURACY}"])


def asset_overrides(assets: Path, model: str) -> list[str]:
    """Point a config at the assets under ``{cluster.fileroot}/assets``."""
    return [f"{model}={assets / ('tiny_model' if model == 'model.path' else 'sft_model')}",
            f"train_dataset.path={assets / 'toy_math' / 'train.jsonl'}",
            f"valid_dataset.path={assets / 'toy_math' / 'valid.jsonl'}"]


def main(overrides: list[str] | None = None) -> int:
    from arealite.launcher.local import main as launch
    from arealite.utils.stats_logger import plot_metrics

    try:
        fileroot = load_config(GRPO_CONFIG, list(overrides or [])).cluster.fileroot
        assets = Path(fileroot) / "assets"
        overrides = asset_overrides(assets, "actor.path") + list(overrides or [])
        grpo = load_config(GRPO_CONFIG, overrides)
    except ConfigError as e:
        print(f"arealite: config error: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    print("== 1/3 building the tiny model and the toy task", flush=True)
    build_assets(assets)
    code = ensure_sft_model(assets, fileroot, Path(grpo.actor.path))
    if code != 0:
        print(f"arealite: SFT warm start failed (exit {code})", file=sys.stderr)
        return code
    print(f"== 3/3 async GRPO on {grpo.launcher.server_backend} servers", flush=True)
    code = launch([GRPO_CONFIG, *overrides])
    out = grpo.run_dir()
    metrics = out / "logs" / "metrics.jsonl"
    if metrics.is_file():
        png = out / "reward_curve.png"
        plot_metrics(metrics, png, keys=["reward", "eval/accuracy"],
                     title=f"{grpo.experiment_name}/{grpo.trial_name}: reward, held-out accuracy")
        print(f"\nDone in {time.monotonic() - t0:.0f}s (exit {code}). Outputs:")
        print(f"  metrics:      {metrics}")
        print(f"  tensorboard:  {out / 'logs' / 'tensorboard'}")
        print(f"  reward curve: {png}")
        print(f"  checkpoints:  {out / 'checkpoints'}")
        print(f"  logs:         {out / 'logs'}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

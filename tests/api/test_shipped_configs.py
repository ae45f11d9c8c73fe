"""The shipped toy configs: the sync twin differs from the main job only in what makes it sync."""

from pathlib import Path

import yaml

from arealite.api.config.loader import load_config

CONFIGS = Path(__file__).parents[2] / "configs"


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flatten(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def test_sync_twin_differs_only_in_the_async_switches():
    main = _flatten(yaml.safe_load((CONFIGS / "toy_grpo.yaml").read_text()))
    sync = _flatten(yaml.safe_load((CONFIGS / "toy_grpo_sync.yaml").read_text()))
    differ = {k for k in main.keys() | sync.keys() if main.get(k) != sync.get(k)}
    assert differ == {"trial_name", "async_training", "rollout.max_head_offpolicyness"}, differ
    assert main["async_training"] is True and sync["async_training"] is False
    assert sync["rollout.max_head_offpolicyness"] == 0


def test_toy_configs_load():
    for name in ("toy_grpo.yaml", "toy_grpo_sync.yaml", "toy_sft.yaml", "toy_dpo.yaml",
                 "toy_reward_model.yaml", "toy_grpo_reward_model.yaml"):
        assert load_config(str(CONFIGS / name), []) is not None

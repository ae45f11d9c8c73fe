"""What a model path holds: a full HF model, a LoRA adapter alone, or nothing loadable.

An adapter-only save (``actor.lora``/``model.lora``) writes ``adapter_config.json`` and
``adapter_model.safetensors`` without the base weights; loading that folder as a model must be
one clear error naming the base model, not a ``state_dict`` mismatch over every ``lora_A`` key.
The pre-launch check (``arealite.launcher.preflight_model``) and the engine both ask here.
"""

from __future__ import annotations

import json
from pathlib import Path


def is_hub_id(path: str) -> bool:
    """``org/name`` that is no local path: a model hub id, loaded (and checked) by its library."""
    return (path.count("/") == 1 and not path.startswith((".", "/", "~"))
            and not Path(path).exists() and not Path(path.split("/")[0]).is_dir())


def model_dir_problem(path: str, key: str) -> str | None:
    """One line saying why ``path`` (the config key ``key``) cannot be loaded as a full model,
    or None when it can (or is a hub id)."""
    if is_hub_id(path):
        return None
    p = Path(path)
    if not p.is_dir():
        # never "build a tiny model there": at outputs/assets/sft_model that untrained model
        # would be taken by `make run` for its trained warm start (it builds what is missing)
        return (f"{key}={path}: no such folder (point it at an HF model folder; `make run` "
                "builds the toy configs' outputs/assets/tiny_model and sft_model, "
                "`arealite tiny-model --out DIR` an untrained tiny model)")
    if (p / "config.json").is_file():
        if (p / "adapter_config.json").is_file():
            return (f"{key}={path} holds both a full model and a LoRA adapter (an adapter saved "
                    "into a model's folder): rebuild the model there, and save adapters to a "
                    "folder of their own")
        return None
    if (p / "adapter_config.json").is_file():
        base = _adapter_base(p)
        return (f"{key}={path} holds a LoRA adapter alone (adapter_config.json), not a full "
                f"model: set {key} to its base model{f' ({base})' if base else ''}, or merge "
                "the adapter into it first")
    return f"{key}={path}: no config.json there, so it holds no HF model"


def _adapter_base(p: Path) -> str:
    try:
        return str(json.loads((p / "adapter_config.json").read_text())
                   .get("base_model_name_or_path") or "")
    except (OSError, ValueError):
        return ""

"""The main job's SFT warm start (the tiny model after SFT, about 0.5 held-out accuracy) and the
toy task, built as ``make run`` builds them: the starting point of the GRPO studies."""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness.paths import ROOT


def ensure_model(fileroot: Path) -> tuple[Path, Path]:
    """The main job's SFT warm-start model and toy data, built as ``make run`` builds them."""
    from arealite.demo.main_job import (
        SFT_CONFIG,
        SFT_WARM_START,
        WARM_START_TRIAL,
        asset_overrides,
        build_assets,
    )
    from arealite.launcher.local import main as launch

    assets = fileroot / "assets"
    build_assets(assets)
    sft = assets / "sft_model"
    if not (sft / "config.json").is_file():
        print(f"building the SFT warm-start model -> {sft}", flush=True)
        code = launch([str(ROOT / SFT_CONFIG), f"trial_name={WARM_START_TRIAL}",
                       *asset_overrides(assets, "model.path"), f"cluster.fileroot={fileroot}",
                       f"output_dir={sft}", *SFT_WARM_START])
        if code != 0:
            raise SystemExit(f"SFT warm start failed (exit {code})")
    return sft, assets / "toy_math"


def ensure_real_model(fileroot: Path) -> tuple[Path, Path]:
    """SmolLM2-135M-Instruct and the real-model job's default reasoning-gym rows, as
    ``arealite real-model-job`` builds them (docs/real_model.md)."""
    from arealite.demo.real_model_job import default_tasks, ensure_assets

    return ensure_assets(fileroot, default_tasks())

"""The main job (``make run`` / ``arealite main-job``): the whole system on a 2-core CPU.

1. builds the tiny model and the toy task (``outputs/assets``) when missing;
2. warm-starts the policy with SFT for a fixed number of steps under a cosine learning rate, so
   that held-out accuracy starts about halfway and RL has something to do;
3. runs async GRPO (``configs/toy_grpo.yaml``) through the local launcher: embedded servers and
   the FSDP2 trainer as separate processes, weights pushed over a gloo broadcast each step;
4. draws the reward curve and says where every output is.

With ``--moe`` (``arealite main-job --moe``) the same job runs on the tiny model's
mixture-of-experts twin (Qwen3-MoE, 4 experts, top-2; assets under ``outputs/assets_moe``, run
``toy-grpo/moe``) with rollout routing replay (``actor.routing_replay``, docs/moe.md).

Overrides (``key=value``) go to the GRPO config, e.g. ``arealite main-job total_train_steps=10``;
those prefixed ``sft.`` go to the SFT warm start, e.g. ``sft.total_train_steps=100`` (a
shortened job, as the tests run it; a warm start already on disk is reused as it is).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from arealite.api.config.loader import ConfigError, load_config

GRPO_CONFIG = "configs/toy_grpo.yaml"
SFT_CONFIG = "configs/toy_sft.yaml"
# The warm start: a fixed number of SFT steps at the config's constant learning rate. It used to
# stop at the first evaluation (every 20 steps) whose teacher-forced held-out accuracy reached
# 0.35; near there that figure jumps by 0.2 between evaluations (280: 0.27, 300: 0.565, 310:
# 0.355, 330: 0.465), so the stopping step, and GRPO's start, moved with any upstream change
# (0.565 or 0.39 from the same recipe on two days' packages). A fixed count under the lock
# (requirements/) gives the same model on every machine: 300 steps is where that rule stopped
# under the lock, held-out 0.565. A cosine decay to 0 over 440 steps ends as flat (0.51-0.575 over
# its last 60 steps) but its model is worse to start RL from: GRPO took it from 0.575 to 0.10-0.20
# within 10 steps (measured twice), where the constant-rate model rises to about 0.9.
SFT_WARM_START = ["total_train_steps=300"]
WARM_START_TRIAL = "warm-start"


def build_assets(assets: Path, moe: bool = False) -> None:
    from arealite.demo.tiny import TinyModelSpec, build_tiny_model
    from arealite.demo.toy_math import write_toy_math

    if not (assets / "tiny_model" / "config.json").is_file():
        build_tiny_model(assets / "tiny_model", TinyModelSpec(moe=moe))
    if not (assets / "toy_math" / "valid.jsonl").is_file():
        write_toy_math(assets / "toy_math", n_train=3000, n_valid=200, seed=0)


def asset_overrides(assets: Path, model: str) -> list[str]:
    """Point a config at the assets under ``{cluster.fileroot}/assets``."""
    return [f"{model}={assets / ('tiny_model' if model == 'model.path' else 'sft_model')}",
            f"train_dataset.path={assets / 'toy_math' / 'train.jsonl'}",
            f"valid_dataset.path={assets / 'toy_math' / 'valid.jsonl'}"]


def ensure_sft(sft_model: Path, sft_cmd: list[str], label: str = "SFT warm start") -> int:
    """The SFT warm start at ``sft_model``, trained through the launcher (``sft_cmd``: config
    and overrides) when missing; the launcher's exit status."""
    from arealite.launcher.local import main as launch

    # the warm start is a shared asset, written once: a job asking for another one (`sft.`
    # overrides) reuses it as it is, and is told so (its figures are then not `make run`'s)
    stamp = sft_model.with_name(sft_model.name + ".args")
    if (sft_model / "config.json").is_file():
        note = _built_otherwise(stamp, sft_model, sft_cmd)
        print(f"== 2/3 {label}: reusing {sft_model}{note}", flush=True)
        return 0
    print(f"== 2/3 {label} -> {sft_model}", flush=True)
    code = launch(warm_start_args(sft_model, sft_cmd))
    if code == 0:
        stamp.write_text("\n".join(sft_cmd) + "\n")
    return code


def warm_start_args(sft_model: Path, sft_cmd: list[str]) -> list[str]:
    """The launcher's arguments that build the warm start at ``sft_model``. A trial of its own:
    `arealite train <sft config>` by hand runs in the config's trial and writes its model there,
    never over the warm start the RL runs load; one trial per assets folder (the MoE twin's warm
    start is another run than the main job's). That trial only ever builds this asset, and
    runs only when the asset is missing (deleted, or a build that failed), so a run found there
    is a stale build: replaced (``launcher.overwrite``), or `make run` would stop for good."""
    trial = warm_start_trial(sft_model.parent.name)
    return [sft_cmd[0], f"trial_name={trial}", *sft_cmd[1:], f"output_dir={sft_model}",
            "launcher.overwrite=true"]


def _built_otherwise(stamp: Path, sft_model: Path, sft_cmd: list[str]) -> str:
    """``, built with ...`` when the warm start on disk was trained with other SFT arguments
    than this job asks for ('' when the same, or when it has no stamp)."""
    if not stamp.is_file():
        return ""
    built = stamp.read_text().splitlines()
    if built == list(sft_cmd):
        return ""
    was = " ".join(a for a in built if a not in sft_cmd) or "the default arguments"
    now = " ".join(a for a in sft_cmd if a not in built)
    return (f", built with {was}" + (f" instead of {now}" if now else "")
            + f" (delete {sft_model} to build this job's own)")


def warm_start_trial(assets_dir: str) -> str:
    """The trial the SFT warm start of the assets folder ``assets_dir`` runs in."""
    return WARM_START_TRIAL if assets_dir == "assets" else f"{WARM_START_TRIAL}-{assets_dir}"


def ensure_sft_model(assets: Path, fileroot: str | Path, sft_model: Path | None = None) -> int:
    """The main job's SFT warm start (default ``assets/sft_model``), built when missing."""
    return ensure_sft(sft_model or assets / "sft_model",
                      [SFT_CONFIG, *asset_overrides(assets, "model.path"),
                       f"cluster.fileroot={fileroot}", *SFT_WARM_START])


def split_sft_overrides(overrides: list[str] | None) -> tuple[list[str], list[str]]:
    """``(GRPO overrides, SFT overrides)``: ``sft.key=value`` goes to the SFT warm start as
    ``key=value`` (GRPO configs have no ``sft`` key), everything else to GRPO."""
    grpo, sft = [], []
    for o in overrides or []:
        (sft if o.startswith("sft.") else grpo).append(o.removeprefix("sft."))
    return grpo, sft


def run_job(overrides: list[str] | None, *, grpo_config: str, sft_config: str, assets_dir: str,
            build: Callable[[Path], None], asset_args: Callable[[Path, str], list[str]],
            sft_args: list[str], steps: tuple[str, str, str]) -> int:
    """Build assets, warm-start by SFT (once), run GRPO through the local launcher, draw the
    curve: the main job and the agent job (``agent_job.py``) differ only in what they pass."""
    from arealite.launcher import run_folder
    from arealite.launcher.local import main as launch
    from arealite.launcher.plan import LaunchError
    from arealite.observe.run_summary import summarize_run

    overrides, sft_overrides = split_sft_overrides(overrides)
    try:
        fileroot = load_config(grpo_config, list(overrides or [])).cluster.fileroot
        assets = Path(fileroot) / assets_dir
        overrides = asset_args(assets, "actor.path") + list(overrides or [])
        grpo = load_config(grpo_config, overrides)
        run_folder.claim(grpo, grpo.launcher.mode)  # refused now, not after the SFT warm start
    except (ConfigError, LaunchError) as e:
        print(f"arealite: {'config' if isinstance(e, ConfigError) else 'launch'} error: {e}",
              file=sys.stderr)
        return 2
    t0 = time.monotonic()
    print(f"== 1/3 {steps[0]}", flush=True)
    build(assets)
    code = ensure_sft(Path(grpo.actor.path), [sft_config, *asset_args(assets, "model.path"),
                                              f"cluster.fileroot={fileroot}", *sft_args, *sft_overrides], steps[1])
    if code != 0:  # the launcher said what failed, once, with its log (outputs/toy-sft/...)
        return code
    print(f"== 3/3 {steps[2].format(backend=grpo.launcher.server_backend)}", flush=True)
    code = launch([grpo_config, *overrides])
    if code == 0:  # a failed run's outputs are not announced; the title names the curves drawn
        summarize_run(grpo.run_dir(), time.monotonic() - t0, code,
                      f"{grpo.experiment_name}/{grpo.trial_name}")
    return code


def main(overrides: list[str] | None = None, moe: bool = False) -> int:
    if moe:  # the MoE twin, its own assets and run; the user's overrides still win
        return run_job(["trial_name=moe", "actor.routing_replay=true", *(overrides or [])],
                       grpo_config=GRPO_CONFIG, sft_config=SFT_CONFIG, assets_dir="assets_moe",
                       build=lambda a: build_assets(a, moe=True), asset_args=asset_overrides,
                       sft_args=SFT_WARM_START,
                       steps=("building the tiny MoE model and the toy task", "SFT warm start",
                              "async GRPO with routing replay on {backend} servers"))
    return run_job(overrides, grpo_config=GRPO_CONFIG, sft_config=SFT_CONFIG, assets_dir="assets",
                   build=build_assets, asset_args=asset_overrides,
                   sft_args=SFT_WARM_START,
                   steps=("building the tiny model and the toy task", "SFT warm start",
                          "async GRPO on {backend} servers"))


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main([a for a in args if a != "--moe"], moe="--moe" in args))

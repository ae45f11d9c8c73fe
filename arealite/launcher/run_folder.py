"""Whose folder is this: a launch writes only into its own run folder
(``{fileroot}/{experiment}/{trial}``) and its own ``output_dir``.

A folder that already holds a run (metrics, checkpoints, recovery checkpoints, a saved model)
is taken over in exactly two cases, both asked for by the user: recovery resumes it
(``recover.mode`` auto/resume with a complete recovery checkpoint there), or
``launcher.overwrite=true`` empties it first. Otherwise the launch is refused with one line
naming the folder and the two ways on, before anything starts, so that a second command never
appends a second run to the first one's ``metrics.jsonl``, tensorboard folder and checkpoints.

An ``output_dir`` outside the run folder (an SFT warm start written for other runs to load) is
guarded the same way: a folder already holding a model is never written over by another run,
since a LoRA adapter saved beside a full model leaves a folder that loads as neither.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from arealite.api.config.experiment import BaseExperimentConfig
from arealite.launcher import plan
from arealite.launcher.plan import LaunchError
from arealite.utils.recover import find_latest, recover_root

# What a trainer leaves in its run folder once it has run (logs alone are left by a launch that
# failed before its first step too; they are appended to, not taken as a run).
RUN_MARKERS = ("logs/metrics.jsonl", "checkpoints", "recover", "model")
# The files an HF save writes into a model folder; with the overwrite flag these (and only
# these) are removed from an output_dir outside the run folder.
MODEL_FILES = ("config.json", "generation_config.json", "adapter_config.json",
               "adapter_model.safetensors", "adapter_model.bin", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
               "added_tokens.json", "chat_template.jinja", "chat_template.json",
               "preprocessor_config.json", "video_preprocessor_config.json")
MODEL_GLOBS = ("model*.safetensors", "model*.safetensors.index.json", "pytorch_model*.bin")


@dataclass(frozen=True)
class Claim:
    """What the launch does with its folders: ``fresh``, ``resume`` or ``overwrite``."""

    action: str
    run_dir: Path
    output_dir: Path | None = None  # an output_dir outside the run folder holding a model

    def apply(self) -> None:
        """Empty what ``overwrite`` takes over (nothing for ``fresh``/``resume``)."""
        if self.action != "overwrite":
            return
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.output_dir is not None:
            for p in model_files(self.output_dir):
                p.unlink(missing_ok=True)


def model_files(folder: Path) -> list[Path]:
    """The HF model/adapter/tokenizer files in ``folder``."""
    found = [folder / n for n in MODEL_FILES if (folder / n).is_file()]
    for g in MODEL_GLOBS:
        found += [p for p in folder.glob(g) if p.is_file()]
    return found


def holds_run(run_dir: Path) -> list[str]:
    """The run markers present in ``run_dir`` (empty: no run has trained there)."""
    out = []
    for m in RUN_MARKERS:
        p = run_dir / m
        if p.is_file() and p.stat().st_size > 0 or p.is_dir() and any(p.iterdir()):
            out.append(m)
    return out


def _outside(path: Path, run_dir: Path) -> bool:
    try:
        path.resolve().relative_to(run_dir.resolve())
        return False
    except ValueError:
        return True


def claim(config: BaseExperimentConfig, mode: str) -> Claim:
    """The decision for this launch, or ``LaunchError`` (one line) when it would write into a
    folder holding another run. Nothing is changed on disk (``Claim.apply`` does that)."""
    run_dir = config.run_dir()
    overwrite = plan.launcher_config(config).overwrite
    if mode == "server_only":  # servers write only their logs, never a run's results
        return Claim("fresh", run_dir)
    out = getattr(config, "output_dir", "") or ""
    out_dir = Path(out) if out and _outside(Path(out), run_dir) else None
    taken_out = out_dir if out_dir is not None and model_files(out_dir) else None
    markers = holds_run(run_dir)
    rc = config.recover
    if markers and rc.mode != "disabled" and find_latest(recover_root(config)) is not None:
        if taken_out is not None and not overwrite:
            raise _refusal(f"output_dir {out_dir} already holds a model", "output_dir=...")
        return Claim("resume", run_dir)
    if overwrite and (markers or taken_out is not None):
        return Claim("overwrite", run_dir, taken_out)
    if markers:
        raise _refusal(f"{run_dir} already holds a run ({', '.join(markers)})",
                       f"trial_name={config.trial_name}-2")
    if taken_out is not None:
        raise _refusal(f"output_dir {out_dir} already holds a model", "output_dir=...")
    return Claim("fresh", run_dir)


def claim_by_hand(config: BaseExperimentConfig, environ: Mapping[str, str] = os.environ) -> None:
    """The same decision for a trainer started without a launcher (``torchrun -m
    arealite.trainer.grpo``, as docs/quickstart.md does by hand; Slurm's trainer.sbatch): a
    launcher's trainers skip it (the launcher decided, and its restarts resume the folder).
    Every rank decides before anything is written (nothing is, before all ranks meet); rank 0
    empties the folder for ``launcher.overwrite``. ``LaunchError`` when refused."""
    if environ.get(plan.CLAIMED_ENV):
        return
    decision = claim(config, "trainer_only")
    if int(environ.get("RANK", "0")) == 0:
        decision.apply()


def _refusal(what: str, fresh: str) -> LaunchError:
    return LaunchError(f"{what}; start a new one with {fresh}, or replace it with "
                       "launcher.overwrite=true (recover.mode=auto resumes a run from its "
                       "recovery checkpoint)")

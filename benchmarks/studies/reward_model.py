"""Reward-model scoring: throughput, and how much of it hides behind generation in a GRPO step.

    python -m benchmarks.studies.reward_model [--quick] [--policy-path DIR] [--rm-path DIR]

Processes: one embedded generation server (the policy), one embedded reward-model server
(``--is-embedding``), this client; each with one torch thread. Without paths the tiny model and
a reward model on its backbone are built in a temp dir (scores are then meaningless, costs are
not).

1. Throughput: toy-task-length sequences scored through ``RemoteRewardModelEngine``, one request
   at a time, then all at once (the server batches concurrent requests into shared forwards);
   samples/s of each and their ratio.
2. Hidden share: one GRPO step's rollout (``rollout_batch`` of B prompts x G samples on the toy
   task, as the sync trainer gathers a batch), with the rule reward alone (T_rule) and with the
   reward model added (T_rm; each sample is scored as soon as it is generated). T_score is the
   time to score the same samples after generation, all at once. Hidden share
   = 1 - (T_rm - T_rule) / T_score, clamped to [0, 1]: the part of the scoring cost the step did
   not pay. Runs alternate (rule, rm, rule, rm, ...) and medians are reported, since the two
   servers share the machine's cores with everything else.
3. Overlap share: in the runs with the reward model, the share of the scoring calls' wall time
   during which a generation request of the same step was still in flight (each call and each
   generation request timed at the client). It says whether the calls run beside generation at
   all; the hidden share says whether that saved time (it cannot when both servers compete for
   the same cores).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _models(args: argparse.Namespace, tmp: str) -> tuple[str, str]:
    from arealite.demo.reward_model import reward_model_from_causal_lm
    from arealite.demo.tiny import build_tiny_model

    policy = args.policy_path or str(build_tiny_model(os.path.join(tmp, "policy")))
    rm = args.rm_path or str(reward_model_from_causal_lm(policy, os.path.join(tmp, "rm")))
    return policy, rm


def _sequences(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)  # prompt (chat template of a toy question) + answer: 24-64 tokens
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(24, 64))] for _ in range(n)]


def throughput(rm_engine, seqs: list[list[int]]) -> tuple[float, float]:
    async def one_at_a_time() -> float:
        t0 = time.perf_counter()
        for s in seqs:
            await rm_engine.ascore_batch([s])
        return len(seqs) / (time.perf_counter() - t0)

    async def all_at_once() -> float:
        t0 = time.perf_counter()
        await rm_engine.ascore_batch(seqs)
        return len(seqs) / (time.perf_counter() - t0)

    asyncio.run(rm_engine.ascore_batch(seqs[:4]))  # warm-up
    return asyncio.run(one_at_a_time()), asyncio.run(all_at_once())


class _Timed:
    """``target``'s ``method`` with each call's (start, end) appended to ``spans``; every other
    attribute is ``target``'s."""

    def __init__(self, target, method: str, spans: list[tuple[float, float]]) -> None:
        self._target, self._method, self._spans = target, method, spans

    def __getattr__(self, name: str):
        attr = getattr(self._target, name)
        if name != self._method:
            return attr

        async def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return await attr(*a, **kw)
            finally:
                self._spans.append((t0, time.perf_counter()))
        return timed


def overlap_share(inner: list[tuple[float, float]], outer: list[tuple[float, float]]) -> float:
    """Of the summed length of the ``inner`` spans, the share that lies inside the union of the
    ``outer`` spans."""
    union: list[list[float]] = []
    for a, b in sorted(outer):
        if union and a <= union[-1][1]:
            union[-1][1] = max(union[-1][1], b)
        else:
            union.append([a, b])
    total = sum(b - a for a, b in inner)
    covered = sum(max(0.0, min(b, ub) - max(a, ua)) for a, b in inner for ua, ub in union)
    return covered / total if total > 0 else 0.0


def hidden_share(rollout, rm_engine, tokenizer, rows, n_samples: int, max_new: int,
                 reps: int) -> dict[str, float]:
    from arealite.api.config.rollout import GenerationHyperparameters
    from arealite.api.reward_model_api import RewardModelScorer
    from workflows.rewards.toy import toy_reward
    from workflows.rlvr import RLVRWorkflow

    gen_spans: list[tuple[float, float]] = []
    score_spans: list[tuple[float, float]] = []

    class TimedScorer(RewardModelScorer):
        async def ascore_batch(self, sequences: list[list[int]]) -> list[float]:
            t0 = time.perf_counter()
            try:
                return await rm_engine.ascore_batch(sequences)
            finally:
                score_spans.append((t0, time.perf_counter()))

    class TimedRLVR(RLVRWorkflow):  # its generation requests timed at the client
        async def arun_episode(self, engine, data):
            return await super().arun_episode(_Timed(engine, "agenerate", gen_spans), data)

    g = GenerationHyperparameters(n_samples=n_samples, max_new_tokens=max_new, temperature=1.0)
    rule = RLVRWorkflow(toy_reward, g, tokenizer)
    with_rm = TimedRLVR(toy_reward, g, tokenizer, reward_model=TimedScorer(),
                        reward_model_combine={"mode": "sum", "rule_weight": 1.0})
    t_rule, t_rm, t_score, overlaps = [], [], [], []
    rollout.rollout_batch(rows[:2], rule)  # warm-up
    for _ in range(reps):
        t0 = time.perf_counter()
        rollout.rollout_batch(rows, rule)
        t_rule.append(time.perf_counter() - t0)
        gen_spans.clear()
        score_spans.clear()
        t0 = time.perf_counter()
        batch = rollout.rollout_batch(rows, with_rm)
        t_rm.append(time.perf_counter() - t0)
        overlaps.append(overlap_share(score_spans, gen_spans))
        seqs = [ids[m.bool()].tolist() for ids, m in zip(batch["input_ids"],
                                                         batch["attention_mask"])]
        t0 = time.perf_counter()
        asyncio.run(rm_engine.ascore_batch(seqs))
        t_score.append(time.perf_counter() - t0)
    tr, tm, ts = (statistics.median(x) for x in (t_rule, t_rm, t_score))
    return {"t_rule": tr, "t_rm": tm, "t_score": ts, "samples": len(rows) * n_samples,
            "hidden": min(1.0, max(0.0, 1.0 - (tm - tr) / ts)),
            "overlap": statistics.median(overlaps)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer samples and repetitions")
    p.add_argument("--policy-path", default=None, help="generation model (default: tiny, built)")
    p.add_argument("--rm-path", default=None, help="reward model (default: on the policy's "
                   "backbone, untrained)")
    args = p.parse_args(argv)
    # SIGTERM (run_all's timeout, `timeout`) unwinds the with-blocks, so the servers stop too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from transformers import AutoTokenizer

    from arealite.api.config.rollout import InferenceEngineConfig
    from arealite.demo.toy_math import generate_toy_math
    from arealite.rollout.remote_engine import RemoteInferenceEngine
    from arealite.rollout.reward_model_client import RemoteRewardModelEngine
    from benchmarks.harness.server_process import Server

    n_seqs, prompts, n_samples, reps = (64, 8, 4, 2) if args.quick else (256, 16, 8, 3)
    with tempfile.TemporaryDirectory() as tmp:
        policy, rm = _models(args, tmp)
        tokenizer = AutoTokenizer.from_pretrained(policy)
        with Server(policy, "--random-seed", "0") as gen, Server(rm, "--is-embedding") as rms:
            # no staleness gate: the version never moves here (as the evaluation client)
            cfg = InferenceEngineConfig(consumer_batch_size=prompts, request_timeout=600,
                                        max_head_offpolicyness=1 << 20)
            rollout = RemoteInferenceEngine(cfg.model_copy(update={"server_addrs": [gen.addr]}))
            rm_engine = RemoteRewardModelEngine(cfg.model_copy(update={"server_addrs": [rms.addr]}))
            rollout.initialize()
            rm_engine.initialize()
            try:
                seqs = _sequences(n_seqs, tokenizer.vocab_size)
                serial, batched = throughput(rm_engine, seqs)
                rows = generate_toy_math(prompts, seed=1)
                h = hidden_share(rollout, rm_engine, tokenizer, rows, n_samples, 32, reps)
            finally:
                rm_engine.destroy()
                rollout.destroy()
    print(f"settings: {n_seqs} sequences of 24-64 tokens; GRPO step of {prompts} prompts x "
          f"{n_samples} samples, 32 new tokens, {reps} repetitions (medians)")
    print(f"scoring one request at a time: {serial:.1f} samples/s")
    print(f"scoring throughput, concurrent requests: {batched:.1f} samples/s (target > 0)")
    print(f"concurrent / one at a time: {batched / serial:.2f}x (target > 1)")
    print(f"GRPO step rollout: rule reward only {h['t_rule']:.2f} s, with the reward model "
          f"{h['t_rm']:.2f} s; scoring its {h['samples']} samples after generation "
          f"{h['t_score']:.2f} s")
    print(f"share of scoring time hidden behind generation: {100 * h['hidden']:.0f}% "
          f"(target > 50%)")
    print(f"share of scoring calls' time with generation still in flight: "
          f"{100 * h['overlap']:.0f}%")
    print(f"cores this process may use: {len(os.sched_getaffinity(0))}, load average "
          f"{os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What brings an over-budget plan under: one config change at a time, each planned again.

The trainer's knobs, in the order tried (cheapest in speed first): gradient checkpointing, the
fused head, twice the context parallelism (when it divides the ranks and the heads), CPU
offload, half the micro-batch. The servers' knob: fewer sequences in flight
(``servers.max_running_requests``), from the formula.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from arealite.api.config.actor import TrainEngineConfig
from arealite.memplan.gpus import usable_bytes
from arealite.memplan.memory_plan import MemoryPlan, gib
from arealite.memplan.model_shapes import read_config, text_config
from arealite.memplan.server_memory import kv_bytes_per_token
from arealite.memplan.trainer_memory import predict_trainer


def trainer_knobs(eng: TrainEngineConfig, hf: dict[str, Any], world: int
                  ) -> Iterator[tuple[str, Any]]:
    """(field, value) changes worth trying on ``eng``, in order."""
    if not eng.gradient_checkpointing:
        yield "gradient_checkpointing", True
    if eng.logprob_head != "fused":
        yield "logprob_head", "fused"
    cp = eng.context_parallel_size * 2
    heads = text_config(hf)["num_attention_heads"]
    if world % cp == 0 and heads % cp == 0:
        yield "context_parallel_size", cp
    if not eng.cpu_offload:
        yield "cpu_offload", True
    if eng.max_tokens_per_mb >= 2048:
        yield "max_tokens_per_mb", eng.max_tokens_per_mb // 2


def fixes_for_trainer(plan: MemoryPlan, eng: TrainEngineConfig, world: int, want: int = 2
                      ) -> list[tuple[str, int]]:
    """Up to ``want`` single changes (as ``key=value``) that each bring the trainer under,
    with their predicted peaks."""
    hf = read_config(eng.path)
    out = []
    for name, value in trainer_knobs(eng, hf, world):
        trial = eng.model_copy(update={name: value})
        peak = predict_trainer(trial, hf, world).peak
        if peak <= plan.usable:
            text = str(value).lower() if isinstance(value, bool) else str(value)
            out.append((f"{plan.key}.{name}={text}", peak))
            if len(out) >= want:
                break
    return out


def server_fix(plan: MemoryPlan, config: Any) -> tuple[str, int] | None:
    """The longest context one sequence can have beside the weights, as
    ``servers.context_length`` (None when not even the weights fit)."""
    s = plan.server
    hf = read_config(getattr(config, plan.key).path)
    per_token = kv_bytes_per_token(hf, s.dtype_bytes, s.tp)
    room = usable_bytes(plan.gpu) - s.breakdown["weights"] - int(text_config(hf)["vocab_size"]) * 4
    n = room // per_token if per_token else 0
    if n < 1:
        return None
    return f"servers.context_length={n}", usable_bytes(plan.gpu) - room + n * per_token


def refusal_line(plan: MemoryPlan, config: Any) -> str:
    """One line: what does not fit, its largest term, and the knobs that bring it under."""
    what, peak = plan.worst()
    head = f"on {plan.gpu.name} (usable {gib(plan.usable)}: {plan.gpu.memory_gib:g} GiB less a " \
           f"10% margin)"
    if what == "server" or (what == "co-located" and plan.server.peak >= plan.trainer.peak):
        s = plan.server
        fix = server_fix(plan, config)
        tail = (f"set {fix[0]} (predicted {gib(fix[1])}) or give each server more GPUs "
                "(launcher.gpus_per_server)" if fix else
                "give each server more GPUs (launcher.gpus_per_server) or a smaller model")
        return (f"each server needs at least {gib(s.minimum)} {head} (weights "
                f"{gib(s.breakdown['weights'])} and one sequence of {s.context} tokens): {tail}")
    key, eng = plan.key, getattr(config, plan.key)
    t = plan.trainer
    term, size = t.largest()
    fixes = fixes_for_trainer(plan, eng, t.world_size)
    if fixes:
        tail = "set " + " or ".join(
            f"{k} ({'predicted ' if i == 0 else ''}{gib(p)})" for i, (k, p) in enumerate(fixes))
    else:
        tail = ("no single knob brings it under: combine gradient checkpointing, the fused head, "
                "context parallelism and a smaller max_tokens_per_mb, or use more GPUs")
    return (f"{key}.max_tokens_per_mb={t.tokens} needs {gib(t.peak)} per rank {head} "
            f"({term} {gib(size)}): {tail}")


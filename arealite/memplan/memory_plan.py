"""A run's memory plan: the trainer's per-rank peak (``trainer_memory``), each server's
(``server_memory``) and, co-located, the GPU they share; checked against one accelerator
(``gpus``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arealite.api.config.actor import TrainEngineConfig
from arealite.memplan.gpus import GIB, GPU, MARGIN, usable_bytes
from arealite.memplan.model_shapes import read_config
from arealite.memplan.server_memory import (
    ServerMemory,
    count_parameters,
    predict_server,
    server_demand,
)
from arealite.memplan.trainer_memory import TrainerMemory, predict_trainer


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def trainer_section(config: Any) -> tuple[str, TrainEngineConfig]:
    """(config key, engine config) of the model the run trains."""
    for key in ("actor", "model"):
        sec = getattr(config, key, None)
        if isinstance(sec, TrainEngineConfig):
            return key, sec
    raise ValueError(f"no trained model section in a {type(config).__name__}")


@dataclass
class MemoryPlan:
    gpu: GPU
    key: str  # the trainer's config section
    trainer: TrainerMemory
    server: ServerMemory | None = None
    colocated: int | None = None  # the shared GPU's peak when launcher.colocate
    notes: list[str] = field(default_factory=list)

    @property
    def usable(self) -> int:
        return usable_bytes(self.gpu)

    def worst(self) -> tuple[str, int]:
        """(what, bytes) of the largest peak on one GPU."""
        parts = [("trainer", self.trainer.peak)]
        if self.server is not None:  # the least it runs with (the rest of its sequences queue)
            parts.append(("server", self.server.minimum))
        if self.colocated is not None:
            parts.append(("co-located", self.colocated))
        return max(parts, key=lambda p: p[1])

    @property
    def fits(self) -> bool:
        return self.worst()[1] <= self.usable


def plan_config(config: Any, gpu: GPU, tokens: int | None = None) -> MemoryPlan:
    """The plan of an experiment config on ``gpu`` (``tokens``: the micro-batch to plan,
    default the trainer's ``max_tokens_per_mb``)."""
    key, eng = trainer_section(config)
    hf = read_config(eng.path)
    lc = config.launcher
    trainer = predict_trainer(eng, hf, lc.trainer_nproc, tokens)
    plan = MemoryPlan(gpu, key, trainer)
    if getattr(config, "servers", None) is not None and lc.mode != "trainer_only":
        seqs, context = server_demand(config, hf)
        tp = max(1, config.servers.tp_size, lc.gpus_per_server)
        dtype = config.servers.dtype if config.servers.dtype != "auto" else "bfloat16"
        plan.server = predict_server(hf, count_parameters(hf), dtype, seqs, context, tp,
                                     config.servers.mem_fraction_static)
        if lc.colocate:
            # release mode: the servers hand back weights and KV cache while the trainer runs,
            # and the trainer's parameters and optimizer state go to host memory while the
            # servers generate (arealite.engine.offload): each phase has the GPU to itself
            plan.colocated = max(trainer.peak, plan.server.minimum)
    if getattr(config, "ref", None) is not None:
        plan.notes.append("the reference model (ref) is not planned yet")
    return plan


def _breakdown(parts: dict[str, int]) -> str:
    return ", ".join(f"{k} {gib(v)}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
                     if v > 0)


def format_plan(plan: MemoryPlan) -> str:
    t = plan.trainer
    eng = f"{plan.key}"
    lines = [f"memory plan on {plan.gpu.name} ({plan.gpu.memory_gib:g} GiB; usable "
             f"{gib(plan.usable)}, a {MARGIN:.0%} margin for the CUDA context, NCCL buffers "
             "and fragmentation)",
             f"trainer ({eng}), per rank of {t.world_size}, micro-batches of {t.tokens} tokens"
             f"{f', context parallel {t.context_parallel}' if t.context_parallel > 1 else ''}: "
             f"peak {gib(t.peak)}",
             f"  {_breakdown(t.breakdown)}",
             f"  of which logits/head (tensors with a vocabulary dimension): {gib(t.head_bytes)}",
             f"  planned in {t.seconds:.1f} s under fake tensors"]
    lines += [f"  note: {n}" for n in t.notes]
    if plan.server is not None:
        s = plan.server
        lines.append(f"server, each: {gib(s.peak)} for all {s.sequences} sequences x "
                     f"{s.context} tokens of context ({_breakdown(s.breakdown)}); at least "
                     f"{gib(s.minimum)} (one sequence); {s.concurrent(plan.usable)} sequences "
                     "at once in the usable memory, the rest queue")
        if s.static_fraction:
            lines.append(f"  SGLang reserves mem_fraction_static={s.static_fraction:g}: "
                         f"{gib(s.static_fraction * plan.gpu.memory_bytes)} up front")
    if plan.colocated is not None:
        lines.append(f"co-located (trainer and server take turns on one GPU): peak "
                     f"{gib(plan.colocated)}")
    lines += [f"note: {n}" for n in plan.notes]
    what, peak = plan.worst()
    verdict = "fits" if plan.fits else "does NOT fit"
    lines.append(f"verdict: {verdict} ({what} peak {gib(peak)} of {gib(plan.usable)} usable)")
    return "\n".join(lines) + "\n"

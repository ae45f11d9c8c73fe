"""One trainer rank's peak device memory, predicted by running the update under fake tensors.

What runs is the engine's code: ``FSDPEngine.initialize``'s steps (``fake_initialize`` below:
model from its HF config, gradient checkpointing, FSDP2 over a fake process group of the
configured ranks, the context-parallel mesh, the head choice, AdamW; ``initialize`` itself also
loads weights and builds its device mesh under the same mode, which fake tensors cannot do),
then one optimizer step over two packed micro-batches of the
planned size (``planning_batch``) in ``FSDPEngine.train_batch``'s order: per micro-batch
``model_forward`` (segment attention, the Ulysses all-to-all, the fused head's ``HeadInput``)
and the PPO actor's loss (``arealite.engine.ppo.loss.actor_loss``), ``backward``, then gradient
clipping and ``optimizer.step()``. The optimizer state exists before the step is tracked (a
real run's steps after the first carry it through forward and backward). ``train_batch``
itself is not called: it reads loss values (``float(loss)``, the gradient norm), which fake
tensors do not have, so the loop below follows it call for call without those reads.

Counting is torch's ``FSDPMemTracker`` (``MemTracker`` for an unsharded world of one): live
storage bytes by category, the peak over the step. The planner runs the model on the CPU under
``FakeTensorMode``; bytes are bytes on any device, but the kernels' own workspace is the CPU
kernels' (e.g. SDPA's flash kernel for CPU keeps O(L) per head like CUDA's).

``cpu_offload``: FSDP2 keeps sharded parameters, gradients and the optimizer state in host
memory; the device peak is the tracked peak less those three at the peak moment.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.distributed.device_mesh import init_device_mesh
from torch.utils._python_dispatch import TorchDispatchMode

from arealite.api.config.actor import PPOActorConfig, TrainEngineConfig
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs
from arealite.engine.ppo.loss import actor_loss
from arealite.memplan.layer_scaling import (
    SHALLOW,
    Segment,
    SegmentRecorder,
    scalable,
    scale_segments,
    with_layers,
)
from arealite.memplan.model_shapes import text_config, write_config_dir
from arealite.memplan.planning_batch import batch_tensors, planned_micro_batches
from arealite.observe.stats_tracker import StatsTracker
from arealite.utils.fsdp import clip_grads_

# the issue's categories, from the trackers' own
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries", "inputs")
_FROM_TRACKER = {
    "Parameter": "parameters", "Sharded Param": "parameters", "Unsharded Param": "parameters",
    "Buffer": "parameters", "Gradient": "gradients", "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients", "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations", "Temp": "temporaries", "All Gather": "temporaries",
    "Reduce Scatter": "temporaries", "Inputs": "inputs", "Other": "inputs",
}
# the largest dense attention mask (bytes) a plan builds for real on the host
DENSE_MASK_LIMIT = 1 << 30
# what CPU offload keeps in host memory (FSDPMemTracker's names)
_OFFLOADED = ("Sharded Param", "Sharded Grad", "OptState")


@dataclass
class TrainerMemory:
    """Predicted peak of one trainer rank (bytes), by category at the peak moment."""

    peak: int
    breakdown: dict[str, int]
    tokens: int
    world_size: int
    context_parallel: int
    seconds: float
    head_bytes: int = 0  # the [tokens x vocab]-shaped tensors live at the peak (logits/head)
    notes: list[str] = field(default_factory=list)

    def largest(self) -> tuple[str, int]:
        return max(self.breakdown.items(), key=lambda kv: kv[1])


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """A default process group of ``world_size`` ranks in which this process is rank 0 and
    every collective returns at once without moving data (torch's ``fake`` backend)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("the planner needs a process without a process group")
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def fake_initialize(engine: FSDPEngine, mode: FakeTensorMode) -> None:
    """``FSDPEngine.initialize`` for a plan: the same steps in the same order, the meshes made
    outside ``mode`` (they are real index tensors), the model, its sharding and its optimizer
    inside it (no storage), no weights loaded. LoRA and routing replay are not planned."""
    from transformers import AutoConfig

    from arealite.engine import context_parallel
    from arealite.engine.checkpoint import auto_model_class, causal_kind
    from arealite.utils.fsdp import apply_fsdp2, to_dtype

    cfg = engine.config
    if cfg.lora is not None:
        raise ValueError("the planner does not plan LoRA runs yet (lora: null to plan the full "
                         "model)")
    engine.rank, engine.world_size = dist.get_rank(), dist.get_world_size()
    engine.dp_group = dist.group.WORLD
    engine.mesh = init_device_mesh("cpu", (engine.world_size,), mesh_dim_names=("dp",))
    engine.cp = context_parallel.make_group(cfg.context_parallel_size, engine.world_size, "cpu",
                                            engine.model_kind)
    if engine.cp is not None:
        engine.attn_impl = context_parallel.ATTN_NAME
    engine.hf_config = AutoConfig.from_pretrained(cfg.path)
    context_parallel.check_model(engine.cp, engine.hf_config)
    dtype = to_dtype(cfg.dtype)
    engine.load_kind = causal_kind(engine.hf_config)
    with mode:
        model = auto_model_class(engine.load_kind).from_config(
            engine.hf_config, dtype=dtype, attn_implementation=engine.attn_impl)
        if cfg.gradient_checkpointing:  # as initialize does
            kw = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
        # on a GPU, offload keeps FSDP2 even on one rank (initialize's rule for cuda)
        engine.sharded = engine.world_size > 1 or cfg.cpu_offload or engine.compute_dtype != dtype
        if engine.sharded:
            apply_fsdp2(model, engine.mesh, engine.compute_dtype,
                        to_dtype(cfg.mixed_precision.reduce_dtype))
        engine.model = model
        engine._fused_head = engine._use_fused_head(model)
        engine.routing = None
        engine._build_optimizer(None)


def _all_real(values: Any) -> bool:
    """No fake tensor among ``values`` (one level of lists looked into: aten's tensor lists)
    and at least one tensor."""
    seen = False
    for v in values:
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(t, FakeTensor):
                return False
            seen = seen or isinstance(t, torch.Tensor)
    return seen


class RealWhereReal(TorchDispatchMode):
    """Fake tensors have no values, so data-dependent ops (``nonzero``, ``repeat_interleave``
    by counts) cannot run on them. The planned batch keeps its small index-like tensors real
    (``cu_seqlens``, the loss mask): an op whose tensor arguments are all real runs for real
    (its outputs are counted all the same). ``nonzero`` of a fake tensor takes the worst case,
    every element selected."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _all_real((*args, *kwargs.values())):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func is torch.ops.aten.nonzero.default:
            x = args[0]
            return torch.empty((x.numel(), x.dim()), dtype=torch.long, device=x.device)
        return func(*args, **kwargs)


def _tracker(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return FSDPMemTracker(model, optimizer)
    t = MemTracker()
    t.track_external(model, optimizer)
    return t


def _prime_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """AdamW makes its state at its first step; later steps (the steady state) carry it."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _update(engine: FSDPEngine, packed: list[dict], loss_fn: Any, tracker: Any = None) -> None:
    """``FSDPEngine.train_batch``'s loop over packed micro-batches, without reading values.
    (The tracker's per-module statistics are cleared after each micro-batch: it refuses a
    module's second forward otherwise; its peak is kept.)"""
    model = engine.model
    engine.optimizer.zero_grad(set_to_none=True)
    for i, p in enumerate(packed):
        if engine.sharded:
            model.set_requires_gradient_sync(i == len(packed) - 1)
        logits = engine.model_forward(p)
        loss = loss_fn(logits, p)
        (loss * (1.0 / len(packed) * engine.world_size)).backward()
        if tracker is not None:
            tracker.reset_mod_stats()
    params = [p for p in model.parameters() if p.requires_grad]
    clip_grads_(params, engine.config.optimizer.gradient_clipping, 1.0)
    engine.optimizer.step()
    engine.optimizer.zero_grad(set_to_none=True)


def _label_logprob_loss(logits: Any, p: dict) -> torch.Tensor:
    """For engines that are not the PPO actor: the label log-probs of the loss rows (SFT's
    loss), through the same head functions."""
    return -gather_logprobs(logits, p["labels"], mask=p["loss_mask"]).sum()


def predict_trainer(engine_config: TrainEngineConfig, hf_config: dict[str, Any], world_size: int,
                    tokens: int | None = None, micro_batches: int = 2,
                    scale_layers: bool = True) -> TrainerMemory:
    """Per-rank peak of one update of micro-batches of ``tokens`` tokens (default: the
    config's ``max_tokens_per_mb``, one sequence each: the largest it allows) on
    ``world_size`` ranks. A model of identical decoder layers is traced at two shallow depths
    and scaled to its own (``layer_scaling``: exact, seconds whatever the depth);
    ``scale_layers=False`` traces every layer. Needs a process without a process group;
    leaves none behind."""
    t0 = time.perf_counter()
    tokens = int(tokens or engine_config.max_tokens_per_mb)
    if engine_config.attn_impl in ("sdpa", "eager") and tokens * tokens > DENSE_MASK_LIMIT:
        # the engine builds the [T, T] block-causal mask from real cu_seqlens: so would the plan
        raise ValueError(f"attn_impl={engine_config.attn_impl} at {tokens} tokens builds a "
                         f"dense [T, T] mask ({tokens * tokens / 2**30:.1f} GiB) in the "
                         "planner's host memory: plan segments or flash_attention_2")
    notes = []
    if scale_layers and scalable(hf_config):
        n1, n2 = SHALLOW
        depth = int(text_config(hf_config)["num_hidden_layers"])
        seg1 = _trace(engine_config, with_layers(hf_config, n1), world_size, tokens,
                      micro_batches)[1]
        seg2 = _trace(engine_config, with_layers(hf_config, n2), world_size, tokens,
                      micro_batches)[1]
        snap = scale_segments(seg1, seg2, n1, n2, depth)
        notes.append(f"traced at {n1} and {n2} decoder layers, scaled to {depth}")
    else:
        snap = _trace(engine_config, hf_config, world_size, tokens, micro_batches)[0]
    raw = dict(snap)
    total = raw.pop("Total")
    head_bytes = raw.pop("vocab", 0)
    if engine_config.cpu_offload:
        total -= sum(raw.get(k, 0) for k in _OFFLOADED)
        for k in _OFFLOADED:
            raw[k] = 0
        notes.append("cpu_offload: sharded parameters, gradients and optimizer state in "
                     "host memory")
    breakdown = dict.fromkeys(CATEGORIES, 0)
    for k, v in raw.items():
        breakdown[_FROM_TRACKER.get(k, "temporaries")] += v
    return TrainerMemory(total, breakdown, tokens, world_size,
                         engine_config.context_parallel_size, time.perf_counter() - t0,
                         head_bytes, notes)


def _trace(engine_config: TrainEngineConfig, hf_config: dict[str, Any], world_size: int,
           tokens: int, micro_batches: int) -> tuple[dict[str, int], list[Segment]]:
    """One update under fake tensors: the breakdown at its peak (with "Total" and "vocab":
    the bytes of tensors with a vocabulary dimension then) and its segments."""
    from arealite.memplan.live_bytes import LiveBytes, model_tensors

    vocab = int(text_config(hf_config)["vocab_size"])
    with tempfile.TemporaryDirectory(prefix="memplan-") as tmp, fake_world(world_size):
        # flash-attn (CUDA only) is planned as one causal segment without its layout
        varlen = engine_config.attn_impl == "flash_attention_2"
        cfg = engine_config.model_copy(update={
            "path": str(write_config_dir(hf_config, Path(tmp) / "model")),
            "init_from_scratch": True,
            "attn_impl": "segments" if varlen else engine_config.attn_impl})
        engine = FSDPEngine(cfg, device="cpu", backend="gloo")
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake_initialize(engine, mode)
        with mode:
            if engine.optimizer is None:
                raise ValueError("the planner plans an update: this engine has no optimizer")
            _prime_optimizer(engine.model, engine.optimizer)
            packed = planned_micro_batches(engine, vocab, tokens, micro_batches, varlen)
            loss_fn: Any = _label_logprob_loss  # SFT, DPO, reward models: a head over all rows
            if isinstance(cfg, PPOActorConfig):
                loss_fn = functools.partial(actor_loss, config=cfg, tracker=StatsTracker(),
                                            prox_sink=[] if cfg.recompute_logprob else None)
            tracker = _tracker(engine.model, engine.optimizer)
            inputs = tuple(t for p in packed for t in batch_tensors(p))
            if hasattr(tracker, "track_inputs"):
                tracker.track_inputs(inputs)
            else:  # MemTracker files them under "Other"
                tracker.track_external(*inputs)
            head = LiveBytes(vocab_dim=vocab)
            head.add_existing(model_tensors(engine.model, engine.optimizer))
            recorder = SegmentRecorder(tracker, engine.model, head)
            with tracker, head, RealWhereReal():
                _update(engine, packed, loss_fn, tracker)
        engine.destroy()
    peak = max(recorder.segments, key=lambda s: s.peak)  # the first of the largest
    return dict(peak.snapshot), recorder.segments

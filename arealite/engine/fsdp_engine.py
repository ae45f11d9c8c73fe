"""``FSDPEngine``: a HF causal LM trained with FSDP2 over packed micro-batches.

Construction needs only the model's config and where to run::

    engine = FSDPEngine(config.actor, device=config.device, backend=config.dist_backend)
    engine.initialize(ft_spec=FinetuneSpec(...))

Process group: under ``torchrun`` from ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``;
a plain process becomes a world of one on a free port. Device (cpu/cuda), backend (gloo/nccl)
and dtypes are configuration; the code path is the same everywhere.

Data: ``train_batch``/``forward`` take a padded trajectory dict (``arealite.api.trajectory``),
split it into micro-batches of at most ``max_tokens_per_mb`` tokens (first-fit-decreasing, the
same count on every rank), pack each one into a single row and run the model on it with
per-sequence attention (``segments``: ``arealite.engine.segment_attention``, cost Σ Lᵢ²; or
``flex``, the same masks as a FlexAttention block mask on CUDA), a dense block-diagonal causal
mask (sdpa/eager) or varlen flash attention (``cu_seqlens``). With
``prefix_group_size > 1`` (the PPO actor sets it to its GRPO group size when
``shared_prompt_packing``) groups stay in one micro-batch and their common prompt is computed
once (``arealite.engine.prefix_pack``); the logits are expanded back to the ordinary packed
layout, so loss functions see no difference. Loss
functions receive ``(logits [T, V], packed_mb)`` where the packed dict is in next-token
alignment: ``logits[i]`` predicts ``labels[i]`` and ``loss_mask[i]``, ``logprobs[i]``, ... refer
to that same token (see ``arealite.engine.packing``). With ``logprob_head: fused`` (the
default) a causal LM's "logits" are a ``HeadInput`` (``arealite.engine.lm_head``): the final
hidden states and the head weight, which ``arealite.engine.functional`` turns into log-probs
and entropy chunk by chunk without a ``[T, V]`` tensor. Splitting, packing and the forward of
one packed micro-batch are ``arealite.engine.packed_forward`` (mixed in); this module builds
the model and trains, evaluates, pushes and saves it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from arealite.api.config.actor import TrainEngineConfig
from arealite.api.engine_api import TrainEngine
from arealite.api.io_struct import (
    FinetuneSpec,
    ParamSpec,
    SaveLoadMeta,
    VersionClock,
    WeightUpdateMeta,
)
from arealite.api.trajectory import TensorDict
from arealite.engine import checkpoint as ckpt
from arealite.engine import context_parallel, lora
from arealite.engine.attn_impl import resolve_attn_impl
from arealite.engine.context_parallel import CPGroup
from arealite.engine.functional import gather_logprobs, zero_loss
from arealite.engine.lm_head import supports_fused_head
from arealite.engine.packed_forward import PackedForward
from arealite.engine.packing import unpack_to_padded
from arealite.engine.routing_replay import RoutingReplay
from arealite.observe.timing import timer
from arealite.utils.distributed import (
    all_reduce,
    init_default_process_group,
    resolve_backend,
    resolve_device,
)
from arealite.utils.fsdp import (
    apply_fsdp2,
    clip_grads_,
    grad_norm,
    load_full_state_dict,
    make_lr_scheduler,
    to_dtype,
)
from arealite.utils.model_dir import model_dir_problem
from arealite.weights.table import transport_for
from arealite.weights.transport import TrainerSide
from arealite.weights.upload import DistributedUploader, param_specs

logger = logging.getLogger("arealite.engine.fsdp")

LossFn = Callable[[torch.Tensor, TensorDict], torch.Tensor]
WeightFn = Callable[[TensorDict], "float | torch.Tensor"]


class FSDPEngine(PackedForward, TrainEngine):
    # "causal_lm": logits over the vocabulary; "value": one scalar per position (a critic,
    # HF token classification with num_labels=1, its backbone loaded from a causal LM);
    # "reward": HF sequence classification with num_labels=1 (engine/preference/reward_model.py)
    model_kind = "causal_lm"

    def __init__(
        self,
        config: TrainEngineConfig,
        device: str = "auto",
        backend: str = "auto",
        seed: int = 1,
        clock: VersionClock | None = None,
    ):
        self.config = config
        self.device = resolve_device(device)
        self.backend = resolve_backend(backend, self.device)
        self.seed = seed
        self.attn_impl = resolve_attn_impl(config.attn_impl, self.device)
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self.hf_config: Any = None
        self.rank, self.world_size = 0, 1
        self.dp_group: dist.ProcessGroup | None = None
        self.clock = clock or VersionClock()  # shared with the rank's rollout client when given
        self.global_step = 0
        self._uploader: DistributedUploader | None = None
        self._train_mode = True
        # rows i*g .. i*g+g-1 share a prompt: kept in one micro-batch, prefix computed once
        self.prefix_group_size = 1
        self.sharded = True  # FSDP2-wrapped (see initialize)
        self._fused_head = False  # loss functions see a HeadInput (see initialize)
        self.cp: CPGroup | None = None  # context-parallel group (context_parallel_size > 1)

    # ------------------------------------------------------------------ set-up

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @property
    def compute_dtype(self) -> torch.dtype:
        return to_dtype(self.config.mixed_precision.param_dtype)

    def initialize(self, addr: str | None = None, ft_spec: FinetuneSpec | None = None) -> None:
        """Join the process group, build and shard the model, load weights from rank 0, and build
        optimizer + schedule (``ft_spec`` gives the total steps; None: a constant schedule)."""
        if not self.config.path:
            raise ValueError("TrainEngineConfig.path is empty: give an HF model directory")
        problem = model_dir_problem(self.config.path, "path")
        if problem:  # an adapter-only folder, say: one line, not a state_dict mismatch
            raise ValueError(problem)
        from transformers import AutoConfig
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.rank, self.world_size = init_default_process_group(self.backend, self.device)
        self.dp_group = dist.group.WORLD
        self.mesh = init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("dp",))
        self.cp = context_parallel.make_group(
            self.config.context_parallel_size, self.world_size, self.device.type, self.model_kind
        )
        if self.cp is not None:
            self.attn_impl = context_parallel.ATTN_NAME
        dtype = to_dtype(self.config.dtype)
        extra = {"num_labels": 1} if self.model_kind in ckpt.SCALAR_HEAD_KINDS else {}
        self.hf_config = AutoConfig.from_pretrained(self.config.path, **extra)
        context_parallel.check_model(self.cp, self.hf_config)
        self.load_kind = self.model_kind
        if self.model_kind == "causal_lm":  # a vision-language model has its own Auto class
            self.load_kind = ckpt.causal_kind(self.hf_config)
        auto_cls = ckpt.auto_model_class(self.load_kind)
        torch.manual_seed(self.seed)
        with torch.device(self.device):
            model = auto_cls.from_config(
                self.hf_config, dtype=dtype, attn_implementation=self.attn_impl
            )
        if self.config.gradient_checkpointing:
            kw = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
        # rank 0 holds the real weights (from disk, or its seeded random init); the others get
        # them by broadcast after sharding, so every rank starts identical.
        full: dict[str, torch.Tensor] = {}
        if self.is_rank0:
            if self.config.init_from_scratch:
                full = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            else:
                full = ckpt.load_hf_state_dict(self.config.path, dtype, self.load_kind)
        if self.config.lora is not None:
            if self.model_kind != "causal_lm":  # its fresh value head would stay frozen
                raise ValueError("lora is supported on causal LMs only, not on a value model")
            model, full = self._wrap_lora(model, full)
        offload = self.config.cpu_offload
        if offload and self.device.type != "cuda":
            logger.info("cpu_offload ignored: the model already lives on the CPU")
            offload = False
        # A world of one has nothing to shard: FSDP2 would still all-gather, copy and
        # reduce-scatter every layer each micro-batch. It stays when it does something there
        # (mixed precision casts, CPU offload).
        self.sharded = self.world_size > 1 or offload or self.compute_dtype != dtype
        if self.sharded:
            apply_fsdp2(
                model, self.mesh, self.compute_dtype,
                to_dtype(self.config.mixed_precision.reduce_dtype), cpu_offload=offload,
            )
        load_full_state_dict(model, full)
        del full
        self.model = model
        self._fused_head = self._use_fused_head(model)
        self.routing: RoutingReplay | None = None
        if self.config.routing_replay:
            if self.cp is not None:  # the experts would have to be sharded like the tokens
                raise ValueError("actor.routing_replay with context_parallel_size > 1 is not "
                                 "supported yet")
            text = self.hf_config.get_text_config()
            self.routing = RoutingReplay(model, int(text.num_hidden_layers))
        self._build_optimizer(ft_spec)
        self._uploader = DistributedUploader(self.backend, self.device)

    def _use_fused_head(self, model: torch.nn.Module) -> bool:
        if self.config.logprob_head != "fused" or self.model_kind != "causal_lm":
            return False
        why = supports_fused_head(model)
        if why is not None:
            logger.warning("logprob_head=fused: using the dense head, %s", why)
        return why is None

    def _wrap_lora(self, model: torch.nn.Module, full: dict[str, torch.Tensor]):
        """The peft model (adapters on the configured modules, base frozen) and the full state
        dict rank 0 broadcasts: the base weights are put in before wrapping (the adapter's
        names differ), so rank 0's adapter init reaches every rank with them."""
        if self.is_rank0:
            model.load_state_dict(full)
        torch.manual_seed(self.seed)
        model = lora.wrap_with_lora(model, self.config.lora, self.model_kind)
        if self.is_rank0:
            full = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        return model, full

    @property
    def _dcp_keeps(self):
        """A LoRA run's DCP checkpoints hold the adapter alone (the base is config.path)."""
        return lora.is_adapter_param if self.is_lora else None

    @property
    def is_lora(self) -> bool:
        return self.config.lora is not None

    def _build_optimizer(self, ft_spec: FinetuneSpec | None) -> None:
        oc = self.config.optimizer
        if oc is None:
            self.model.requires_grad_(False)
            return
        # only trainable parameters get optimizer state (with LoRA: the adapter alone)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=oc.lr, betas=(oc.beta1, oc.beta2), eps=oc.eps,
            weight_decay=oc.weight_decay,
        )
        total = ft_spec.total_train_steps if ft_spec is not None else 1
        kind = oc.lr_scheduler_type if ft_spec is not None else "constant"
        self.lr_scheduler = make_lr_scheduler(
            self.optimizer, kind, total, oc.warmup_steps_proportion, oc.min_lr_ratio, oc.warmup_steps
        )

    def destroy(self) -> None:
        """Free model, optimizer and the weight-update group. The default process group is
        process-wide (other engines may share it) and stays up."""
        if self._uploader is not None:
            self._uploader.close()
        self.model = self.optimizer = self.lr_scheduler = None

    def train(self, mode: bool = True) -> FSDPEngine:
        self._train_mode = mode
        if self.model is not None:
            self.model.train(mode)
        return self

    def _check_ready(self) -> torch.nn.Module:
        if self.model is None:
            raise RuntimeError("FSDPEngine is not initialized (call initialize())")
        return self.model

    # ------------------------------------------------------------------ training

    def train_batch(self, input_: TensorDict, loss_fn: LossFn, loss_weight_fn: WeightFn) -> dict[str, float]:
        model = self._check_ready()
        if self.optimizer is None:
            raise RuntimeError("this engine has no optimizer (optimizer: null in its config)")
        self.train(True)
        # a cp group trains on the rows of all its ranks
        input_, _ = context_parallel.gather_rows(input_, self.cp)
        mbl = self.split_micro_batches(input_)
        packed = [self.pack(mb, idx) for mb, idx in zip(mbl.mbs, mbl.indices)]
        weights = [float(loss_weight_fn(p)) if idx else 0.0 for p, idx in zip(packed, mbl.indices)]
        share = context_parallel.token_share(self.cp)  # each cp rank counts its group's tokens
        tokens = sum(int(p["cu_seqlens"][-1]) for p in packed) / share
        totals = torch.tensor([sum(weights), tokens],
                              dtype=torch.float64, device=self._comm_device())
        all_reduce(totals, group=self.dp_group)
        total_w = float(totals[0])
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self._comm_device())
        for i, (p, w) in enumerate(zip(packed, weights)):
            if self.sharded:
                model.set_requires_gradient_sync(i == len(packed) - 1)
            logits = self.model_forward(p)
            if w > 0 and total_w > 0:
                loss = loss_fn(logits, p)
                # FSDP averages gradients over ranks, so the world size cancels that mean and
                # the gradient is that of Σ_tokens loss / Σ_tokens over all ranks and mbs.
                scaled = loss * (w / total_w * self.world_size)
                loss_sum += float(loss.detach()) * w
            else:
                # no loss here (dummy or weightless micro-batch): still run backward so the
                # FSDP collectives of every rank match
                scaled = zero_loss(logits)
            scaled.backward()
        all_reduce(loss_sum, group=self.dp_group)
        params = [p for p in model.parameters() if p.requires_grad]
        norm = grad_norm(params, self.dp_group)
        ok = bool(torch.isfinite(torch.tensor(norm)))
        if ok:
            clip_grads_(params, self.config.optimizer.gradient_clipping, norm)
            self.optimizer.step()
        else:
            logger.warning("non-finite grad norm %s: optimizer step skipped", norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        return {
            "loss": float(loss_sum) / total_w if total_w > 0 else 0.0,
            "grad_norm": norm,
            "update_successful": float(ok),
            "lr": self.optimizer.param_groups[0]["lr"],
            "n_mbs": float(len(mbl)),
            "n_tokens": float(totals[1]),
            "loss_weight": total_w,
        }

    def step_lr_scheduler(self) -> None:
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    @torch.no_grad()
    def forward(
        self,
        input_: TensorDict,
        post_hook: Callable[[torch.Tensor, TensorDict], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """No-grad forward. ``post_hook(logits, packed_mb)`` returns one value per packed
        position (next-token aligned); the default is the label logprob at temperature 1 (the
        value for a ``value`` model: ``out[b, t]`` is then the value of the state before t).
        Returns ``[B, S]`` in input order, each value on the token it describes (0 at t = 0)."""
        model = self._check_ready()
        was_training = self._train_mode
        model.eval()
        try:
            width = input_["input_ids"].shape[1]
            input_, own = context_parallel.gather_rows(input_, self.cp)
            mbl = self.split_micro_batches(input_)
            outs = []
            for mb, idx in zip(mbl.mbs, mbl.indices):
                p = self.pack(mb, idx)
                logits = self.model_forward(p)
                if post_hook is not None:
                    v = post_hook(logits, p)
                elif self.model_kind == "value":
                    v = logits.squeeze(-1)
                else:
                    v = gather_logprobs(logits, p["labels"])
                v = context_parallel.gather_tokens(v, self.cp, p.get("cp_tokens", 0))
                outs.append(unpack_to_padded(v.float(), p["cu_seqlens"], mb["input_ids"].shape[1],
                                             shift_back=True))
            return mbl.restore(outs)[own, :width].cpu()
        finally:
            model.train(was_training)

    # ------------------------------------------------------------------ weights

    def get_param_specs(self, bucket_size_mb: float | None = None) -> list[list[ParamSpec]]:
        return param_specs(self._check_ready(), bucket_size_mb or 64.0)

    def upload_weights(self, meta: WeightUpdateMeta) -> None:
        """This rank's half of ``meta``'s transport (``arealite.weights.table``: disk, a
        broadcast, by reference, an adapter), handed the model. Collective."""
        model = self._check_ready()
        side = TrainerSide(
            model, self.rank, self.world_size, self.dp_group, self._uploader,
            save_hf=lambda path: ckpt.save_hf(model, path),
            adapter=lora.ModelAdapter(model) if self.is_lora else None,
        )
        # Summarised per step as timeperf/weight_upload; an info line per step drowned the console.
        with timer("weight_upload"):
            transport_for(meta, lora=self.is_lora).upload(side, meta)

    # ------------------------------------------------------------------ checkpoints

    def save(self, meta: SaveLoadMeta) -> None:
        model = self._check_ready()
        if meta.weight_format == "hf" and self.is_lora:
            # the adapter alone (peft's format); the base model is config.path
            lora.save_adapter(model, meta.path)
            if self.is_rank0 and meta.tokenizer is not None:
                meta.tokenizer.save_pretrained(str(meta.path))
            dist.barrier(group=self.dp_group)
        elif meta.weight_format == "hf":
            ckpt.save_hf(model, meta.path, tokenizer=meta.tokenizer, processor=meta.processor)
        elif meta.weight_format == "dcp":
            extra = {
                "version": self.clock.value,
                "global_step": self.global_step,
                "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler else None,
                "world_size": self.world_size,
            }
            ckpt.save_dcp(model, self.optimizer if meta.with_optim else None, meta.path, extra,
                          only=self._dcp_keeps)
        else:
            raise ValueError(f"unknown weight_format {meta.weight_format!r}")

    def load(self, meta: SaveLoadMeta) -> None:
        model = self._check_ready()
        if meta.weight_format == "hf" and self.is_lora:
            lora.load_adapter(model, meta.path)
        elif meta.weight_format == "hf":
            full = ckpt.load_hf_state_dict(meta.path, to_dtype(self.config.dtype),
                                           self.load_kind) if self.is_rank0 else {}
            load_full_state_dict(model, full)
        elif meta.weight_format == "dcp":
            if meta.with_optim and self.optimizer is None:
                raise ValueError("with_optim=True but this engine has no optimizer")
            extra = ckpt.load_dcp(model, self.optimizer if meta.with_optim else None, meta.path,
                                  only=self._dcp_keeps)
            self.clock.value = int(extra.get("version", 0))
            self.global_step = int(extra.get("global_step", 0))
            if meta.with_optim and self.lr_scheduler is not None and extra.get("lr_scheduler"):
                self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        else:
            raise ValueError(f"unknown weight_format {meta.weight_format!r}")

    def set_version(self, version: int) -> None:
        self.clock.value = int(version)

    def get_version(self) -> int:
        return self.clock.value

    def _comm_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")


"""One Tinker training model on arealite's FSDP2 engine: ``forward_backward`` accumulates the
gradient of a built-in loss (``arealite.tinker.losses``) over packed micro-batches, and
``optim_step`` applies it with the caller's Adam hyper-parameters, as Tinker separates the two
(the engine's own ``train_batch`` does both in one call).

Alignment. Tinker's ``loss_fn_inputs`` are one value per *input* position (``target_tokens[i]``
is the token predicted at position ``i``); the engine's packer moves every per-token key into
next-token alignment (value ``t`` is read from position ``t + 1``). So each row is laid out one
position to the right, with one padding token appended to the input: after packing, position
``i`` carries the datum's value ``i`` again, and the appended position (which predicts nothing)
is masked out of the loss.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from arealite.api.config.actor import TrainEngineConfig
from arealite.api.io_struct import SaveLoadMeta, VersionClock
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs
from arealite.tinker.losses import LOSSES, resolve
from arealite.tinker.wire import Datum
from arealite.utils.fsdp import clip_grads_, grad_norm

logger = logging.getLogger("arealite.tinker.trainer")

VALID = "tinker_valid"  # the packed positions that carry a datum's value (not the appended one)
_PREFIX = "tinker_in_"  # the datum's loss_fn_inputs, under names the packer cannot confuse


@dataclass
class AdamStep:
    """Tinker's ``AdamParams`` (its defaults)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


def batch_of(data: list[Datum]) -> dict[str, torch.Tensor]:
    """The padded ``[B, S]`` batch of ``data`` laid out for the engine's packer (module
    comment): input ids plus one appended token, every input one position to the right."""
    width = max(len(d.tokens) for d in data) + 1
    B = len(data)
    ids = torch.zeros(B, width, dtype=torch.long)
    am = torch.zeros(B, width, dtype=torch.long)
    valid = torch.zeros(B, width, dtype=torch.bool)
    keys = sorted({k for d in data for k in d.inputs})
    inputs = {k: torch.zeros(B, width, dtype=torch.long if k == "target_tokens" else torch.float32)
              for k in keys}
    for b, d in enumerate(data):
        n = len(d.tokens)
        ids[b, :n] = torch.tensor(d.tokens, dtype=torch.long)
        ids[b, n] = d.tokens[-1]  # the appended position: attended by nobody, predicts nothing
        am[b, : n + 1] = 1
        valid[b, 1: n + 1] = True
        for k in keys:
            if k not in d.inputs:
                raise ValueError(f"every datum of one call must carry the same loss_fn_inputs "
                                 f"(datum {b} has no {k!r})")
            inputs[k][b, 1: n + 1] = d.inputs[k].to(inputs[k].dtype)
    out = {"input_ids": ids, "attention_mask": am, VALID: valid}
    out.update({_PREFIX + k: v for k, v in inputs.items()})
    return out


class TinkerModel:
    """A model being trained for one Tinker training client (LoRA, or every weight)."""

    def __init__(self, config: TrainEngineConfig, device: str = "cpu", backend: str = "gloo",
                 seed: int = 1, clock: VersionClock | None = None) -> None:
        self.engine = FSDPEngine(config, device, backend, seed, clock)
        self.engine.initialize(None, None)  # constant schedule: optim_step sets the lr
        self.steps = 0

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.engine.model.parameters() if p.requires_grad]

    def forward_backward(self, data: list[Datum], loss_fn: str,
                         loss_fn_config: Mapping[str, float] | None, forward_only: bool
                         ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """The per-datum target log-probs and the summed loss; unless ``forward_only`` its
        gradient is added to the parameters' (until ``optim_step``)."""
        keys = set.intersection(*(set(d.inputs) for d in data))
        config = resolve(loss_fn, loss_fn_config, keys)
        fn = LOSSES[loss_fn]
        engine = self.engine
        model = engine._check_ready()
        model.train(not forward_only)
        batch = batch_of(data)
        mbl = engine.split_micro_batches(batch)
        per_row: dict[int, np.ndarray] = {}
        total = 0.0
        with torch.set_grad_enabled(not forward_only):
            for mb, rows in zip(mbl.mbs, mbl.indices):
                if not rows:
                    continue
                p = engine.pack(mb, rows)
                if engine.sharded:
                    model.set_requires_gradient_sync(True)
                logits = engine.model_forward(p)
                valid = p[VALID]
                targets = p[_PREFIX + "target_tokens"]
                logp = gather_logprobs(logits, targets)[valid]
                inputs = {k[len(_PREFIX):]: v[valid].float() for k, v in p.items()
                          if k.startswith(_PREFIX) and k != _PREFIX + "target_tokens"}
                loss = fn(logp, inputs, config)
                if not forward_only:
                    loss.backward()
                total += float(loss.detach())
                lp = logp.detach().float().cpu().numpy()
                lens = (p["cu_seqlens"][1:] - p["cu_seqlens"][:-1]).cpu().tolist()
                start = 0
                for row, n in zip(rows, lens):
                    per_row[row] = lp[start: start + n - 1]  # n - 1: the appended position
                    start += n - 1
        outputs = [{"logprobs": per_row[i]} for i in range(len(data))]
        return outputs, {"loss:sum": total}

    def optim_step(self, adam: AdamStep) -> dict[str, float]:
        """One AdamW step with ``adam``'s settings on the accumulated gradient, then zero it."""
        opt = self.engine.optimizer
        if opt is None:
            raise RuntimeError("this model has no optimizer")
        for g in opt.param_groups:
            g.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                     weight_decay=adam.weight_decay)
        params = self.params
        norm = grad_norm(params, self.engine.dp_group)
        if not np.isfinite(norm):
            opt.zero_grad(set_to_none=True)
            raise FloatingPointError(f"non-finite gradient norm {norm}: step skipped")
        if adam.grad_clip_norm > 0:
            clip_grads_(params, adam.grad_clip_norm, norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.steps += 1
        self.engine.global_step = self.steps
        return {"grad_norm": float(norm), "step": float(self.steps)}

    def save_state(self, path: str, with_optimizer: bool = True) -> None:
        """A recovery checkpoint (``dcp``: the adapter or all weights, the optimizer)."""
        self.engine.save(SaveLoadMeta(path=path, weight_format="dcp", with_optim=with_optimizer))

    def load_state(self, path: str, with_optimizer: bool) -> None:
        self.engine.load(SaveLoadMeta(path=path, weight_format="dcp", with_optim=with_optimizer))
        self.steps = self.engine.global_step

    def info(self) -> dict[str, Any]:
        lora = self.engine.config.lora
        return {"is_lora": lora is not None, "lora_rank": lora.rank if lora else None}

    def destroy(self) -> None:
        self.engine.destroy()

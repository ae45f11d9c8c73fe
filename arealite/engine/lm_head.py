"""Label log-probabilities (and entropy) straight from the final hidden states and the LM-head
weight, in token chunks, so no ``[T, V]`` tensor (logits, softmax or their gradient) outlives
one chunk.

Why: with Qwen's 151,936-token vocabulary the fp32 logits of 8,192 tokens are 5 GB and their
gradient another 5 GB; the trainer only ever needs one number (two with entropy) per token.

``fused_logprobs`` is a custom autograd function: the forward keeps, per token, the
log-normaliser (and entropy) only; the backward recomputes each chunk's logits from the saved
hidden states and weight and turns them into that chunk's gradient at once. Cost: one more
``[c, H] x [H, V]`` product per chunk than the dense head (four instead of three), against the
dense head's full-size softmax and gradient passes over ``[T, V]`` memory.

The engine hands loss functions a ``HeadInput`` (hidden states + head weight) instead of logits
when ``TrainEngineConfig.logprob_head`` is ``fused``; ``arealite.engine.functional``'s
``gather_logprobs``/``gather_logprobs_entropy``/``logprobs_and_entropy`` accept either, so loss
code is the same for both. ``capture_head`` is how the engine gets the hidden states out of a
HF model without running its head (FSDP2's hooks still run: the weight is the unsharded
parameter of the root module's forward, and its gradient goes through FSDP's reduce-scatter).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

DEFAULT_CHUNK = 1024


def _slices(n: int, chunk_size: int) -> Iterator[slice]:
    step = max(1, int(chunk_size))
    for i in range(0, n, step):
        yield slice(i, min(n, i + step))


def chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """fp32 ``(hidden @ weight.T + bias) / temperature`` of one chunk. The product runs in the
    weight's dtype, like the model's own ``lm_head`` (so bf16 matches the dense head)."""
    z = hidden.to(weight.dtype) @ weight.t()
    if bias is not None:
        z = z + bias
    z = z.float()
    if temperature != 1.0:
        z.div_(temperature)
    return z


class _FusedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, chunk_size, with_entropy):
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        ent = hidden.new_empty(n if with_entropy else 0, dtype=torch.float32)
        for sl in _slices(n, chunk_size):
            z = chunk_logits(hidden[sl], weight, bias, temperature)
            lz = torch.logsumexp(z, dim=-1)
            lse[sl] = lz
            logp[sl] = z.gather(-1, labels[sl, None]).squeeze(-1) - lz
            if with_entropy:  # H = lse - sum(p * z), p = exp(z - lse)
                p = z.sub(lz[:, None]).exp_()
                ent[sl] = lz - p.mul_(z).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, ent)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, bias, labels, lse, ent = ctx.saved_tensors
        T = ctx.temperature
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        # accumulated over chunks in fp32 whatever the weight dtype
        grad_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        )
        grad_b = (
            torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        )
        use_ent = ctx.with_entropy and g_ent is not None
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.float()
        for sl in _slices(hidden.shape[0], ctx.chunk_size):
            h = hidden[sl]
            # d logp_y / dz = onehot_y - p;  d H / dz = -p * (log p + H)   (z = logits / T)
            logsm = chunk_logits(h, weight, bias, T).sub_(lse[sl, None])
            p = logsm.exp()
            if use_ent:
                gz = logsm.add_(ent[sl, None]).mul_(g_ent[sl, None].float())
                gz = gz.add_(g_logp[sl, None]).mul_(p).neg_()
                del p
            else:
                gz = p.mul_(-g_logp[sl, None])
                del logsm
            gz.scatter_add_(1, labels[sl, None], g_logp[sl, None])
            if T != 1.0:
                gz.div_(T)
            gz = gz.to(weight.dtype)
            if need_h:
                grad_h[sl] = (gz @ weight).to(hidden.dtype)
            if need_w and weight.dtype == torch.float32:
                grad_w.addmm_(gz.t(), h.float())
            elif need_w:  # a bf16/fp16 product like the dense head's, summed in fp32
                grad_w.add_(gz.t() @ h.to(weight.dtype))
            if need_b:
                grad_b.add_(gz.float().sum(0))
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def fused_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    bias: torch.Tensor | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax((hidden @ weight.T + bias) / temperature)[i, labels[i]]`` (fp32 ``[N]``)
    and, with ``with_entropy``, the entropy of that distribution per row (differentiable too);
    ``hidden [N, H]``, ``weight [V, H]``. Memory: ``O(chunk_size x V)`` beyond the inputs."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if isinstance(weight, DTensor):
        raise TypeError("fused_logprobs needs the unsharded head weight (see capture_head)")
    logp, ent = _FusedLogprobs.apply(
        hidden, weight, bias, labels.long(), float(temperature), int(chunk_size), bool(with_entropy)
    )
    return logp, (ent if with_entropy else None)


@dataclass
class HeadInput:
    """What a causal LM's head would turn into logits: ``hidden [T, H]`` (next-token aligned,
    like logits) and the head's ``weight [V, H]`` / ``bias``. Loss functions pass it to
    ``arealite.engine.functional`` exactly like logits."""

    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    chunk_size: int = DEFAULT_CHUNK

    @property
    def shape(self) -> tuple[int, int]:
        return (self.hidden.shape[0], self.weight.shape[0])

    def __len__(self) -> int:
        return self.hidden.shape[0]

    def select(self, index: torch.Tensor) -> HeadInput:
        """The same head on the rows ``index`` only (differentiable: their gradient reaches
        the full hidden states)."""
        return HeadInput(self.hidden.index_select(0, index), self.weight, self.bias,
                         self.chunk_size)

    def detach(self) -> HeadInput:
        b = None if self.bias is None else self.bias.detach()
        return HeadInput(self.hidden.detach(), self.weight.detach(), b, self.chunk_size)

    def chunks(self, temperature: float = 1.0) -> Iterator[tuple[slice, torch.Tensor]]:
        """``(rows, fp32 logits / temperature of those rows)`` one chunk at a time, for
        statistics that need the whole distribution (no gradient is kept)."""
        with torch.no_grad():
            for sl in _slices(self.hidden.shape[0], self.chunk_size):
                yield sl, chunk_logits(self.hidden[sl], self.weight, self.bias, temperature)

    def logits(self) -> torch.Tensor:
        """The dense logits (``[T, V]``, differentiable): for code that really wants them."""
        z = self.hidden.to(self.weight.dtype) @ self.weight.t()
        return z if self.bias is None else z + self.bias

    def zero_loss(self) -> torch.Tensor:
        """A zero that reaches the head weight too, so a rank with nothing to learn still runs
        the same FSDP gradient collectives as one that has."""
        z = self.hidden.sum() * 0.0 + self.weight.sum() * 0.0
        return z if self.bias is None else z + self.bias.sum() * 0.0


def supports_fused_head(model: nn.Module) -> str | None:
    """Why this model's head cannot be fused (None: it can). The fused head computes exactly
    ``hidden @ W.T + b``; heads that scale or soft-cap logits afterwards differ."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear):
        return f"its output embedding is {type(head).__name__}, not a Linear layer"
    cfg = getattr(model, "config", None)
    for key in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        v = getattr(cfg, key, None)
        if v not in (None, 1, 1.0):
            return f"its config sets {key}={v} (logits are rescaled after the head)"
    return None


class _Capture:
    """Hooks on the head: its input becomes the model's "logits" and its matmul is skipped."""

    def __init__(self) -> None:
        self.active = False
        self.hidden: torch.Tensor | None = None
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None

    def pre(self, module: nn.Linear, args):
        if not self.active:
            return None
        (h,) = args[:1]
        self.hidden, self.weight, self.bias = h, module.weight, module.bias
        return (h.narrow(-2, 0, 0),) + tuple(args[1:])  # an empty product instead of [T, V]

    def post(self, module: nn.Linear, args, out):
        if not self.active:
            return None
        return self.hidden


def install_capture(model: nn.Module) -> _Capture:
    """Register (once) the hooks ``capture_head`` switches on; the module tree and the state
    dict stay as they are."""
    cap = getattr(model, "_arealite_head_capture", None)
    if cap is None:
        cap = _Capture()
        head = model.get_output_embeddings()
        head.register_forward_pre_hook(cap.pre)
        head.register_forward_hook(cap.post)
        model._arealite_head_capture = cap
    return cap


@contextlib.contextmanager
def capture_head(model: nn.Module, chunk_size: int = DEFAULT_CHUNK) -> Iterator[dict]:
    """Within the block the model's forward returns the final hidden states as ``logits``;
    afterwards ``box["head"]`` is the ``HeadInput`` (weight and bias as seen inside the forward:
    under FSDP2 the root's unsharded parameters, which is what the gradient must reach)."""
    cap = install_capture(model)
    box: dict = {}
    cap.active = True
    try:
        yield box
        if cap.weight is not None:
            box["head"] = HeadInput(cap.hidden, cap.weight, cap.bias, chunk_size)
    finally:  # even when the forward raised: no reference to its tensors stays behind
        cap.active = False
        cap.hidden = cap.weight = cap.bias = None

"""Which experts each token was routed to: SGLang's ``--enable-return-routed-experts``.

A mixture-of-experts layer's router picks ``top_k`` experts per token; RL trainers replay those
choices (rollout routing replay) so that the trainer's forward runs the experts the server ran.
SGLang captures them per forward into a ``[tokens, num_hidden_layers, top_k]`` int32 buffer
(``layers/moe/routed_experts_capturer.py``) and answers a request that set
``return_routed_experts`` with ``meta_info["routed_experts"]``: base64 of that array's bytes
for the rows ``[routed_experts_start_len, prompt + output - 1)`` (the last token is never fed
to a forward, so it has no routing). Layers without experts keep zeros, as in SGLang.

Here a forward hook on each MoE layer's router (transformers' ``*TopKRouter``, which returns
``(router_logits, routing_weights, expert_indices)``) records the indices of the last forward;
the engine reads them after each forward and files them under each sequence's positions. The
model code is untouched: without the flag no hook is installed.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch

# Router modules whose forward returns (logits, weights, indices [tokens, top_k]); the MoE block
# that owns one names it ``gate``. Qwen2-MoE and Qwen3-MoE share this contract in transformers 5.
ROUTER_CLASSES = frozenset({"Qwen3MoeTopKRouter", "Qwen2MoeTopKRouter"})


def moe_routers(decoder: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """``{layer index: router}`` for each decoder layer whose MLP is a routed MoE block."""
    out: dict[int, torch.nn.Module] = {}
    for i, layer in enumerate(getattr(decoder, "layers", [])):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is not None and type(gate).__name__ in ROUTER_CLASSES:
            out[i] = gate
    return out


def encode_routed_experts(rows: np.ndarray) -> str:
    """SGLang's wire form: base64 of the int32 array's bytes (little-endian, C order)."""
    return base64.b64encode(np.ascontiguousarray(rows, dtype="<i4").tobytes()).decode("ascii")


class RoutedExpertsCapture:
    """Forward hooks on every router of ``decoder``; ``take`` returns the last forward's choices."""

    def __init__(self, decoder: torch.nn.Module, num_layers: int) -> None:
        self.routers = moe_routers(decoder)
        if not self.routers:
            raise ValueError(
                "--enable-return-routed-experts: this model has no mixture-of-experts "
                f"layer (routers known: {', '.join(sorted(ROUTER_CLASSES))})"
            )
        self.num_layers = num_layers
        self.top_k = int(next(iter(self.routers.values())).top_k)
        self._last: dict[int, torch.Tensor] = {}
        self._handles = [r.register_forward_hook(self._hook(i)) for i, r in self.routers.items()]

    def _hook(self, layer: int):
        def record(_module: Any, _args: Any, output: Any) -> None:
            self._last[layer] = output[2]

        return record

    def take(self, batch: int, tokens: int) -> torch.Tensor:
        """The last forward's expert ids as int32 ``[batch, tokens, num_layers, top_k]`` on the
        CPU (the router saw the ``[batch, tokens]`` block flattened row-major)."""
        out = torch.zeros(batch * tokens, self.num_layers, self.top_k, dtype=torch.int32)
        for layer, idx in self._last.items():
            out[:, layer] = idx.reshape(batch * tokens, self.top_k).to("cpu", torch.int32)
        self._last = {}
        return out.view(batch, tokens, self.num_layers, self.top_k)

    def close(self) -> None:
        for h in self._handles:
            h.remove()


class SequenceRouting:
    """One sequence's routed experts by position: chunks written by prefills and decode steps
    (a retracted sequence's re-prefill covers its positions again)."""

    __slots__ = ("chunks", "num_layers", "top_k", "start_len")

    def __init__(self, num_layers: int, top_k: int, start_len: int = 0) -> None:
        self.chunks: list[tuple[int, torch.Tensor]] = []
        self.num_layers, self.top_k = num_layers, top_k
        self.start_len = start_len  # the request's ``routed_experts_start_len``

    def write(self, start: int, rows: torch.Tensor) -> None:
        self.chunks.append((start, rows))

    def rows(self, end: int) -> np.ndarray:
        """``[end - start_len, num_layers, top_k]`` int32 for positions ``[start_len, end)``;
        the first chunk to cover a position wins: a token keeps the routing it had when the
        tokens after it were sampled, as the client's join of resumed segments does (a re-prefill
        after a ``retract`` pause, maybe under new weights, only fills what is missing)."""
        start = self.start_len
        out = np.zeros((max(0, end - start), self.num_layers, self.top_k), dtype=np.int32)
        for s, r in reversed(self.chunks):
            lo, hi = max(s, start), min(s + r.shape[0], end)
            if lo < hi:
                out[lo - start : hi - start] = r[lo - s : hi - s].numpy()
        return out

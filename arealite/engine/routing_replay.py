"""Rollout routing replay: each MoE layer of the trainer routes a token to the experts the
inference server routed it to (``actor.routing_replay``).

A mixture-of-experts router picks its top-k experts from logits that differ by float noise
between the server (another dtype, batch shape, kernel) and the trainer; a near-tie then flips
an expert, the token's output changes by far more than the noise, and the importance ratio of
the update compares two different networks. Replay removes that: the server reports each
token's experts (``routed_experts`` in the trajectory), and here the router's output is
replaced by those experts, weighted by the *trainer's own* router probabilities over them
(softmax over all experts, gathered at the replayed ids, renormalised when the model's router
renormalises its top-k), so the router still learns through the weights it gives.

It is a forward hook on each router module (transformers' ``*TopKRouter``, whose forward
returns ``(router_logits, routing_weights, expert_indices)``), installed once on the built
model: the model code is untouched and the hook works the same whatever computes attention or
the log-probs around it. Rows of -1 (a sequence's last token, padding) keep the router's own
choice. The hook also measures, per layer, the share of tokens whose own top-k set equals the
replayed one (routing agreement) and how evenly tokens spread over the experts (load balance).
"""

from __future__ import annotations

import re
from typing import Any

import torch

# Routers whose forward returns (logits, weights, indices) from softmax -> top-k (-> optional
# renormalisation); the servers' capture (servers/engine/routed_experts.py) keys on the same
# class names, each side keeping its own copy since the two share only the wire protocol.
ROUTER_CLASSES = frozenset({"Qwen3MoeTopKRouter", "Qwen2MoeTopKRouter"})
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def find_routers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """``{decoder layer index: router module}`` of every MoE layer (any wrapping: FSDP, peft)."""
    out: dict[int, torch.nn.Module] = {}
    for name, mod in model.named_modules():
        if type(mod).__name__.removeprefix("FSDP") in ROUTER_CLASSES:  # fully_shard renames
            m = _LAYER.search(name)
            if m is None:
                raise ValueError(f"router {name} is not under a decoder layer (layers.<i>.)")
            out[int(m.group(1))] = mod
    return out


def replay_weights(logits: torch.Tensor, experts: torch.Tensor, renormalize: bool) -> torch.Tensor:
    """The router's weights for ``experts [T, k]`` from its ``logits [T, E]``: softmax over all
    experts in float32, gathered at the given ids, renormalised over them when the model's
    router renormalises its own top-k; in the logits' dtype, as the router returns them."""
    probs = torch.softmax(logits.float(), dim=-1)
    w = probs.gather(1, experts)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w.to(logits.dtype)


def topk_agreement(own: torch.Tensor, replayed: torch.Tensor) -> torch.Tensor:
    """Per token, whether the two ``[T, k]`` expert-id rows hold the same set."""
    return (own.sort(-1).values == replayed.sort(-1).values).all(-1)


class LayerStats:
    """One layer's running sums over the forwards since the last ``take_stats``."""

    __slots__ = ("agree", "compared", "load")

    def __init__(self, num_experts: int) -> None:
        self.agree = 0
        self.compared = 0
        self.load = torch.zeros(num_experts, dtype=torch.float64)


class RoutingReplay:
    """Hooks on every router of ``model``; ``replay(experts)`` routes the next forward by them."""

    def __init__(self, model: torch.nn.Module, num_layers: int) -> None:
        self.routers = find_routers(model)
        if not self.routers:
            raise ValueError(
                "routing_replay: the model has no mixture-of-experts layer "
                f"(routers known: {', '.join(sorted(ROUTER_CLASSES))})"
            )
        any_router = next(iter(self.routers.values()))
        self.num_layers = num_layers
        self.top_k = int(any_router.top_k)
        self.num_experts = int(any_router.num_experts)
        self.width = num_layers * self.top_k  # ids per token in a trajectory's routed_experts
        self._experts: torch.Tensor | None = None  # [T, num_layers, top_k] while replaying
        self._seen: set[int] = set()  # layers already measured in this forward (a checkpointed
        # layer runs again in backward: replayed again, counted once)
        self.stats = {i: LayerStats(self.num_experts) for i in self.routers}
        self._handles = [r.register_forward_hook(self._hook(i)) for i, r in self.routers.items()]

    def replay(self, experts: torch.Tensor | None) -> None:
        """From now until the next call, routers replay ``experts`` (``[T, num_layers *
        top_k]``, in the order the next forward sees its tokens); None: they route freely
        (still measured). Set before each forward, it holds through that forward's backward,
        where checkpointed layers run again."""
        if experts is not None:
            if experts.dim() != 2 or experts.shape[1] != self.width:
                raise ValueError(
                    f"routed_experts has {tuple(experts.shape)[1:]} ids per token; "
                    f"this model routes {self.num_layers} layers x top-{self.top_k} "
                    f"= {self.width}"
                )
            experts = experts.long().view(-1, self.num_layers, self.top_k)
        self._experts, self._seen = experts, set()

    def _hook(self, layer: int):
        def hook(module: Any, _args: Any, output: Any) -> Any:
            logits, weights, own = output
            replay = self._experts
            first = layer not in self._seen
            self._seen.add(layer)
            if replay is None:
                if first:
                    self._record(layer, own, None)
                return None
            if replay.shape[0] != own.shape[0]:
                raise ValueError(
                    f"routing replay: {replay.shape[0]} tokens of routed experts, "
                    f"the model's layer {layer} routes {own.shape[0]}"
                )
            ids = replay[:, layer].to(own.device)
            valid = (ids >= 0).all(-1, keepdim=True)
            ids = torch.where(valid, ids, own)
            w = replay_weights(logits, ids, bool(getattr(module, "norm_topk_prob", False)))
            if first:
                self._record(layer, own, ids, valid.squeeze(-1))
            return logits, torch.where(valid, w, weights), ids

        return hook

    @torch.no_grad()
    def _record(
        self,
        layer: int,
        own: torch.Tensor,
        used: torch.Tensor | None,
        valid: torch.Tensor | None = None,
    ) -> None:
        s = self.stats[layer]
        routed = own if used is None else used
        s.load += torch.bincount(routed.reshape(-1).cpu(), minlength=self.num_experts).double()
        if used is not None and valid is not None:
            s.agree += int(topk_agreement(own[valid], used[valid]).sum())
            s.compared += int(valid.sum())

    def take_stats(self) -> dict[str, float]:
        """Per MoE layer since the last call: ``agreement`` (share of replayed tokens whose own
        top-k set equals the server's; absent when nothing was replayed) and ``max_load``
        (the busiest expert's share of assignments times the number of experts: 1 is even)."""
        out: dict[str, float] = {}
        for i, s in sorted(self.stats.items()):
            if s.compared:
                out[f"moe/agreement/layer{i}"] = s.agree / s.compared
            total = float(s.load.sum())
            if total:
                out[f"moe/max_load/layer{i}"] = float(s.load.max()) / total * self.num_experts
        if any(s.compared for s in self.stats.values()):
            out["moe/agreement"] = sum(s.agree for s in self.stats.values()) / sum(
                s.compared for s in self.stats.values()
            )
        self.stats = {i: LayerStats(self.num_experts) for i in self.routers}
        return out

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def replay_rows(packed: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """A packed micro-batch's ``routed_experts`` in the order the model sees its tokens: with
    shared prompts (``shared_input_ids``) each shared token takes its packed rows' routing."""
    rows = packed.get("routed_experts")
    if rows is None or "expand_index" not in packed:
        return rows
    shared = rows.new_full((packed["shared_input_ids"].shape[0], rows.shape[1]), -1)
    valid = rows[:, 0] >= 0  # a row's last token (-1) never overwrites a shared token's routing
    shared[packed["expand_index"][valid]] = rows[valid]
    return shared

"""Live tensor bytes, counted by storage: the CPU stand-in for ``max_memory_allocated``.

A ``TorchDispatchMode`` sees every tensor an op returns; each distinct storage is counted once
at its size, and uncounted when Python frees it (a weak reference's callback). FSDP2 frees and
re-allocates its unsharded parameters by resizing their storage in place
(``UntypedStorage.resize_``), so resizes are followed too. Tensors made before the mode is
entered (the model's parameters, the optimizer's state) are added with ``add_existing``.

What it measures: the bytes of tensor storages alive at once, as an allocator without caching
or rounding would hold them. What it does not: the allocator's block rounding and
fragmentation, kernels' internal workspace that never becomes a tensor, communication
libraries' own buffers. It runs on real tensors (the validation's measured side) and on fake
ones (the planner's logits/head share: ``vocab_dim``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _local(t: torch.Tensor) -> torch.Tensor:
    inner = getattr(t, "_local_tensor", None)  # a DTensor's shard
    return inner if isinstance(inner, torch.Tensor) else t


class LiveBytes(TorchDispatchMode):
    """``with LiveBytes() as lb: ...`` then ``lb.peak`` (bytes). With ``vocab_dim`` set,
    ``vocab_bytes_at_peak`` is the part of the peak held by tensors whose last dimension is
    that size (a causal LM's logits and what comes from them)."""

    def __init__(self, vocab_dim: int | None = None) -> None:
        super().__init__()
        self.vocab_dim = vocab_dim
        self.live = 0
        self.peak = 0
        self.vocab_live = 0
        self.vocab_bytes_at_peak = 0
        self._sizes: dict[int, list] = {}  # id(storage) -> [bytes, is_vocab, weakref]
        self._orig_resize = None

    # ------------------------------------------------------------------ counting
    def _count(self, t: torch.Tensor) -> None:
        t = _local(t)
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        st = t.untyped_storage()
        key = id(st)
        if key in self._sizes:
            return
        vocab = self.vocab_dim is not None and t.dim() > 0 and t.shape[-1] == self.vocab_dim \
            and not isinstance(t, torch.nn.Parameter)
        n = st.nbytes()
        ref = weakref.ref(st, lambda _r, k=key: self._freed(k))
        self._sizes[key] = [n, vocab, ref]
        self._add(n, vocab)

    def _add(self, n: int, vocab: bool) -> None:
        self.live += n
        if vocab:
            self.vocab_live += n
        if self.live > self.peak:
            self.peak = self.live
            self.vocab_bytes_at_peak = self.vocab_live

    def _freed(self, key: int) -> None:
        entry = self._sizes.pop(key, None)
        if entry is not None:
            self.live -= entry[0]
            if entry[1]:
                self.vocab_live -= entry[0]

    def _resized(self, st: torch.UntypedStorage, size: int) -> None:
        entry = self._sizes.get(id(st))
        if entry is None:
            return
        delta = int(size) - entry[0]
        entry[0] = int(size)
        if delta > 0:
            self._add(delta, entry[1])
        else:
            self.live += delta
            if entry[1]:
                self.vocab_live += delta

    def add_existing(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors made before the mode was entered (parameters, gradients, optimizer
        state)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._count(t)

    # ------------------------------------------------------------------ the mode
    def __enter__(self) -> LiveBytes:
        orig = torch.UntypedStorage.resize_
        self._orig_resize = orig
        mode = self

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            out = orig(st, size)
            mode._resized(st, size)
            return out

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *args: Any) -> None:
        torch.UntypedStorage.resize_ = self._orig_resize
        return super().__exit__(*args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._count(t)
        return out


def model_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> list:
    """Parameters, buffers, gradients and optimizer state: what lives before a step starts."""
    out: list[torch.Tensor] = [*model.parameters(), *model.buffers()]
    out += [p.grad for p in model.parameters() if p.grad is not None]
    if optimizer is not None:
        for state in optimizer.state.values():
            out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out

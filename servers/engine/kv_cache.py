"""A slot-based KV cache that plugs into a transformers decoder as its ``past_key_values``.

Each running request owns one *row* (slot) of per-layer tensors shaped
``[rows, kv_heads, length, head_dim]``. A forward pass covers a contiguous range of rows
``[r0, r1)``; every row writes its new keys/values at its own positions, so rows of different
lengths share one batched forward with no left padding. Attention sees the keys
``[0, kv_len)`` of each row, and the caller passes a boolean mask (``causal_slot_mask``) that
hides, per row, every key past that row's query position.

transformers' attention layers only call ``update(k, v, layer_idx)`` on the cache object, so a
small duck-typed class is enough; nothing here depends on a model architecture.
"""

from __future__ import annotations

import torch


def causal_slot_mask(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Boolean ``[B, 1, T, kv_len]`` mask: query at absolute position p sees keys ``<= p``.

    Padded query slots get positions past the row's real tokens; they still see key 0, so no
    attention row is empty (an empty row would give NaNs that poison later layers).
    """
    keys = torch.arange(kv_len, device=positions.device)
    return (keys.view(1, 1, -1) <= positions.unsqueeze(-1)).unsqueeze(1)


class SlotKVCache:
    """Per-layer K/V storage indexed by request slot; grows on demand."""

    def __init__(
        self,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        max_len: int,
    ) -> None:
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.max_len = max_len  # hard cap on positions (context length + padding slack)
        self.rows = 0
        self.length = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        # Set by ``bind`` before each forward.
        self._r0 = 0
        self._r1 = 0
        self._write_pos: torch.Tensor | None = None
        self._kv_len = 0

    # ---- capacity -------------------------------------------------------------------------
    def ensure(self, rows: int, length: int) -> None:
        """Make room for ``rows`` slots of ``length`` positions (amortised doubling)."""
        if length > self.max_len:
            raise ValueError(f"KV length {length} exceeds the cache cap {self.max_len}")
        if rows <= self.rows and length <= self.length:
            return
        new_rows = max(rows, self.rows, 1)
        if rows > self.rows:
            new_rows = max(rows, min(2 * self.rows, rows + 64))
        new_len = self.length
        if length > self.length:
            new_len = min(self.max_len, max(length, 2 * self.length, 64))
        shape = (new_rows, self.kv_heads, new_len, self.head_dim)
        for i in range(self.num_layers):
            for store in (self.k, self.v):
                fresh = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if i < len(store):
                    old = store[i]
                    fresh[: old.shape[0], :, : old.shape[2]] = old
                    store[i] = fresh
                else:
                    store.append(fresh)
        self.rows, self.length = new_rows, new_len

    def release(self) -> None:
        """Free all memory (called when the server goes idle or weights change)."""
        self.k, self.v = [], []
        self.rows = self.length = 0

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of row ``src`` into row ``dst``."""
        if src == dst or length <= 0:
            return
        for store in (self.k, self.v):
            for t in store:
                t[dst, :, :length] = t[src, :, :length]

    def copy_rows(self, src: list[int], dst: list[int], length: int) -> None:
        """Rows ``dst[i]`` take the first ``length`` positions of rows ``src[i]``; every source
        is read before any row is written (one indexed copy per tensor)."""
        if not dst or length <= 0:
            return
        s = torch.tensor(src, device=self.device)
        d = torch.tensor(dst, device=self.device)
        for store in (self.k, self.v):
            for t in store:
                t[d, :, :length] = t[s, :, :length]

    # ---- per-forward binding --------------------------------------------------------------
    def bind(self, r0: int, r1: int, write_pos: torch.Tensor, kv_len: int) -> None:
        """Next forward covers rows ``[r0, r1)``; token (b, t) is stored at ``write_pos[b, t]``."""
        self._r0, self._r1 = r0, r1
        self._write_pos = write_pos
        self._kv_len = kv_len

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """transformers' cache hook: store this step's K/V, return the visible K/V of the rows."""
        k = self.k[layer_idx][self._r0 : self._r1]
        v = self.v[layer_idx][self._r0 : self._r1]
        pos = self._write_pos
        if pos.shape[1] == 1:
            # Decode: one token per row; scatter along the length axis.
            idx = pos.view(-1, 1, 1, 1).expand(-1, self.kv_heads, 1, self.head_dim)
            k.scatter_(2, idx, key_states.to(self.dtype))
            v.scatter_(2, idx, value_states.to(self.dtype))
        else:
            rows = torch.arange(pos.shape[0], device=pos.device).unsqueeze(1)
            k[rows, :, pos] = key_states.permute(0, 2, 1, 3).to(self.dtype)
            v[rows, :, pos] = value_states.permute(0, 2, 1, 3).to(self.dtype)
        return k[:, :, : self._kv_len], v[:, :, : self._kv_len]

    # transformers may query these on a cache object; answer conservatively.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    @property
    def is_compileable(self) -> bool:
        return False

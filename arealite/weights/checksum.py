"""Per-tensor checksums of weights, as a server's ``/weights_checker`` computes them
(docs/protocol.md): the first 8 bytes of SHA-256 over the tensor's raw bytes, as 16 hex digits
(SGLang's CPU ``_hash_tensor``). A hash of the bytes changes with any single changed element in
any dtype; the trainer hashes each tensor in the dtype the server holds it in."""

from __future__ import annotations

import hashlib

import torch

HASH_NAME = "sha256-64"  # what a server that hashes this way reports in "hash"


def tensor_checksum(t: torch.Tensor, dtype: torch.dtype | None = None) -> str:
    """Checksum of ``t`` cast to ``dtype`` (its own when None); a CUDA tensor is copied to CPU."""
    t = t.detach()
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)  # round-to-nearest-even, the same cast a server applies on load
    t = t.contiguous().cpu()
    return hashlib.sha256(memoryview(t.reshape(-1).view(torch.uint8).numpy())).digest()[:8].hex()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")

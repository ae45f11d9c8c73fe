"""Tensors handed to a process on the same host by reference: SGLang's
``MultiprocessingSerializer`` format (a base64 ``ForkingPickler`` dump), the payload of
``/update_weights_from_tensor``.

Pickled by ``ForkingPickler``, torch's reductions move a CPU tensor's storage into shared memory
(once: a storage already shared stays where it is) and write only its name; a CUDA tensor becomes
a CUDA IPC handle. Only torch's ``file_system`` sharing strategy names a block that an unrelated
process (the server) can open, so ``serialize_named_tensors`` switches this process to it.
"""

from __future__ import annotations

import base64
import io
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing as torch_mp


def use_file_system_sharing() -> None:
    """Share CPU tensors by shared-memory file name (readable by any process of this user)."""
    if torch_mp.get_sharing_strategy() != "file_system":
        torch_mp.set_sharing_strategy("file_system")


def serialize_named_tensors(named: list[tuple[str, torch.Tensor]]) -> str:
    """``MultiprocessingSerializer.serialize(named, output_str=True)``. The tensors must stay
    alive (and unchanged) until the receiver has applied them."""
    use_file_system_sharing()
    buf = io.BytesIO()
    ForkingPickler(buf).dump([(n, t.detach()) for n, t in named])
    return base64.b64encode(buf.getvalue()).decode()


def serialize_tensor_dict(tensors: dict[str, torch.Tensor]) -> str:
    """The ``/load_lora_adapter_from_tensors`` payload (``load_format`` null): SGLang pickles the
    adapter's ``{name: tensor}`` dict itself. The same lifetime rule as above."""
    use_file_system_sharing()
    buf = io.BytesIO()
    ForkingPickler(buf).dump({n: t.detach() for n, t in tensors.items()})
    return base64.b64encode(buf.getvalue()).decode()


LORA_FROM_TENSORS_PATH = "/load_lora_adapter_from_tensors"


def lora_tensors_body(name: str, config: dict, tensors: dict[str, torch.Tensor]) -> dict:
    """A ``/load_lora_adapter_from_tensors`` body (SGLang's ``LoadLoRAAdapterFromTensorsReqInput``)
    for one server, as one flattened bucket: an adapter is dozens of small tensors, and each
    tensor of a plain dump costs a shared-memory file of its own. A fresh dump per server,
    since the receiver's unpickling consumes the references a dump takes."""
    flat, metadata = flatten_tensors(tensors)
    return {"lora_name": name, "config_dict": config, "load_format": "flattened_bucket",
            "serialized_named_tensors": [serialize_flattened_bucket(flat, metadata)]}


def flatten_tensors(tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[dict]]:
    """One ``uint8`` tensor holding every tensor's bytes, and SGLang's bucket metadata (byte
    offsets) as dicts."""
    parts, metadata, off = [], [], 0
    for n, t in tensors.items():
        b = t.detach().contiguous().reshape(-1).view(torch.uint8)
        metadata.append({"name": n, "shape": t.shape, "dtype": t.dtype, "start_idx": off,
                         "end_idx": off + b.numel(), "numel": t.numel()})
        parts.append(b)
        off += b.numel()
    return torch.cat(parts), metadata
def release_payload_refs(named: list[tuple[str, torch.Tensor]]) -> None:
    """Give back the references one ``serialize_named_tensors(named)`` took, for a payload its
    receiver never unpickled (unpickling consumes them). Pickling takes one reference per
    distinct shared block (its memo shares a block between views), so one is given back per
    block; a block whose count stays raised is unlinked only when this process exits."""
    seen: set[int] = set()
    for _, t in named:
        if t.device.type != "cpu" or not t.is_shared():
            continue
        s = t.untyped_storage()
        if s.nbytes() and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            s._shared_decref()


def serialize_flattened_bucket(flat: torch.Tensor, metadata: list) -> str:
    """The ``load_format="flattened_bucket"`` payload: ``flat`` (uint8) and SGLang's metadata
    entries (objects or dicts with name, shape, dtype, start_idx, end_idx, numel)."""
    use_file_system_sharing()
    buf = io.BytesIO()
    ForkingPickler(buf).dump({"flattened_tensor": flat, "metadata": metadata})
    return base64.b64encode(buf.getvalue()).decode()

"""Decoding SGLang's ``/update_weights_from_tensor`` payload: no tensor bytes in the body.

SGLang's format (``UpdateWeightsFromTensorReqInput``): ``serialized_named_tensors`` holds one
base64 string per TP rank, each ``MultiprocessingSerializer.serialize(obj, output_str=True)``,
that is a ``multiprocessing.reduction.ForkingPickler`` dump. ``obj`` is ``[(name, tensor), ...]``
(``load_format`` null or ``"direct"``) or, for ``load_format="flattened_bucket"``,
``{"flattened_tensor": T, "metadata": [FlattenedTensorMetadata(name, shape, dtype, start_idx,
end_idx, numel), ...]}`` where ``T`` is the bucket as one ``uint8`` tensor and the indices are
byte offsets into it.

A ForkingPickler dump carries no tensor data: torch's reductions put a CPU tensor's storage in
shared memory and pickle its name (``rebuild_storage_filename``), a CUDA tensor's as a CUDA IPC
handle (``rebuild_cuda_tensor``). The server maps the same pages, so the bytes cross once: from
the shared pages into the model. Only torch's ``file_system`` sharing strategy works between
unrelated processes (the default ``file_descriptor`` one passes descriptors over a socket that
only the sender's own children may use): a payload that uses it is refused by name.

The unpickler only builds what such a payload holds (torch's rebuild functions, dtypes, sizes,
the bucket metadata); anything else is refused, as SGLang's ``SafeUnpickler`` does.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from dataclasses import dataclass

import torch

NamedTensors = list[tuple[str, torch.Tensor]]

LOAD_FORMATS = (None, "direct", "flattened_bucket")


class PayloadError(ValueError):
    """A payload this server cannot read; the message names what is wrong."""


@dataclass
class FlattenedTensorMetadata:
    """SGLang's bucket entry (``sglang.srt.weight_sync.tensor_bucket``), rebuilt under our name."""

    name: str = ""
    shape: torch.Size | tuple = ()
    dtype: torch.dtype = torch.float32
    start_idx: int = 0
    end_idx: int = 0
    numel: int = 0


_REDUCTIONS = "torch.multiprocessing.reductions"
_ALLOWED = {
    (_REDUCTIONS, "rebuild_tensor"),
    (_REDUCTIONS, "rebuild_parameter"),
    (_REDUCTIONS, "rebuild_storage_filename"),
    (_REDUCTIONS, "rebuild_storage_empty"),
    (_REDUCTIONS, "rebuild_typed_storage"),
    (_REDUCTIONS, "rebuild_typed_storage_child"),
    (_REDUCTIONS, "rebuild_cuda_tensor"),
    ("torch", "Size"), ("torch", "Tensor"), ("torch", "device"),
    ("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage"),
    ("torch.nn.parameter", "Parameter"),
    ("collections", "OrderedDict"),
}


class _PayloadUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name == "FlattenedTensorMetadata":  # SGLang's class, wherever the sender defined it
            return FlattenedTensorMetadata
        if module == _REDUCTIONS and name == "rebuild_storage_fd":
            raise PayloadError(
                "a tensor is shared by file descriptor, which only the sender's child processes "
                "can open: the sender must call torch.multiprocessing.set_sharing_strategy("
                "'file_system') before serializing")
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise PayloadError(f"the payload refers to {module}.{name}, which a weight payload "
                           "does not hold (only tensors, dtypes, sizes and bucket metadata)")


def deserialize(data: str | bytes) -> object:
    """``MultiprocessingSerializer.deserialize`` with the restricted unpickler."""
    if isinstance(data, str):
        try:
            data = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as e:
            raise PayloadError(f"serialized_named_tensors[0] is not valid base64: {e}") from None
    if data[:2] == b"PK":
        raise PayloadError("the payload is a torch.save archive; this endpoint takes SGLang's "
                           "MultiprocessingSerializer (ForkingPickler) dump")
    try:
        return _PayloadUnpickler(io.BytesIO(data)).load()
    except PayloadError:
        raise
    except Exception as e:  # a truncated pickle, a shared block that is gone, ...
        raise PayloadError(f"cannot unpickle the payload: {type(e).__name__}: {e}") from None


def named_tensors(serialized: list[str | bytes], load_format: str | None) -> NamedTensors:
    """The ``(name, tensor)`` pairs of a request (tp_size is 1 here: one entry)."""
    obj = _own_rank(serialized, load_format)
    if load_format == "flattened_bucket":
        return _unflatten(obj)
    if not isinstance(obj, (list, tuple)) or not obj:
        raise PayloadError(f"expected a non-empty list of (name, tensor) pairs, got "
                           f"{type(obj).__name__}")
    out = []
    for i, item in enumerate(obj):
        if not (isinstance(item, (list, tuple)) and len(item) == 2
                and isinstance(item[0], str) and isinstance(item[1], torch.Tensor)):
            raise PayloadError(f"item {i} is not a (name, tensor) pair")
        out.append((item[0], item[1]))
    return out


def tensor_dict(serialized: list[str | bytes], load_format: str | None) -> dict[str, torch.Tensor]:
    """The ``{name: tensor}`` of a ``/load_lora_adapter_from_tensors`` request: SGLang pickles a
    dict there (``load_format`` null) or a flattened bucket."""
    obj = _own_rank(serialized, load_format)
    if load_format == "flattened_bucket":
        return dict(_unflatten(obj))
    if not isinstance(obj, dict) or not obj or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise PayloadError(f"expected a non-empty dict of name -> tensor, got "
                           f"{type(obj).__name__}")
    return obj


def _own_rank(serialized: list[str | bytes], load_format: str | None) -> object:
    """The one rank's payload object (tp_size is 1 here)."""
    if load_format not in LOAD_FORMATS:
        raise PayloadError(f"load_format {load_format!r} is not supported here; use one of "
                           f"{list(LOAD_FORMATS)}")
    if len(serialized) != 1:
        raise PayloadError(f"serialized_named_tensors has {len(serialized)} entries; this "
                           "server has tp_size 1, so it takes exactly one")
    return deserialize(serialized[0])


def _unflatten(obj: object) -> NamedTensors:
    if not isinstance(obj, dict) or not {"flattened_tensor", "metadata"} <= set(obj):
        raise PayloadError('load_format "flattened_bucket" needs {"flattened_tensor": tensor, '
                           '"metadata": [FlattenedTensorMetadata, ...]}')
    flat, metas = obj["flattened_tensor"], obj["metadata"]
    if not isinstance(flat, torch.Tensor) or not isinstance(metas, (list, tuple)) or not metas:
        raise PayloadError("flattened_tensor must be a tensor and metadata a non-empty list")
    flat = flat.reshape(-1)
    out = []
    for m in metas:
        if not isinstance(m, (FlattenedTensorMetadata, dict)):
            raise PayloadError(f"metadata entry of type {type(m).__name__}")
        get = m.get if isinstance(m, dict) else lambda k, m=m: getattr(m, k, None)
        name, dtype, shape = get("name"), get("dtype"), torch.Size(get("shape") or ())
        a, b = int(get("start_idx")), int(get("end_idx"))
        if not isinstance(dtype, torch.dtype):
            raise PayloadError(f"{name}: dtype {dtype!r} is not a torch dtype")
        if not 0 <= a <= b <= flat.numel():
            raise PayloadError(f"{name}: [{a}, {b}) lies outside the bucket of {flat.numel()}")
        part = flat[a:b]
        if flat.dtype == torch.uint8:  # byte offsets (SGLang's multi-dtype buckets)
            if (b - a) != shape.numel() * dtype.itemsize or a % dtype.itemsize:
                raise PayloadError(f"{name}: {b - a} bytes at offset {a} do not hold "
                                   f"{tuple(shape)} of {dtype}")
            part = part.view(dtype)
        elif part.numel() != shape.numel() or flat.dtype != dtype:
            raise PayloadError(f"{name}: elements [{a}, {b}) of a {flat.dtype} bucket do not "
                               f"hold {tuple(shape)} of {dtype}")
        out.append((str(name), part.view(shape)))
    return out


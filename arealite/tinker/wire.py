"""The Tinker SDK's binary wire format, server side: ``forward_backward`` requests arrive as the
SDK's protobuf (``tinker.proto.tinker_public_pb2``), and ``ForwardBackwardOutput`` /
``SampleResponse`` results go back as protobuf when the SDK asks for it (``Accept:
application/x-protobuf``, which it always does for those two types). The message classes are
the SDK's own, so the two sides cannot drift; this module only maps them to and from tensors.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import torch
from tinker.proto import tinker_public_pb2 as pb

PROTO_CONTENT_TYPE = "application/x-protobuf"

_NP = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


class WireError(ValueError):
    """A request body the SDK would never send (a user error: 400)."""


@dataclass
class Datum:
    """One training example: its input tokens and its ``loss_fn_inputs``, one value per
    input position (``target_tokens[i]`` is the token predicted at position ``i``)."""

    tokens: list[int]
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class FwdBwdRequest:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float]
    data: list[Datum]
    forward_only: bool


def _tensor(msg: pb.Tensor, name: str) -> torch.Tensor:
    dt = _NP.get(msg.dtype)
    if dt is None:
        raise WireError(f"loss_fn_inputs[{name!r}]: unsupported dtype {msg.dtype}")
    if msg.HasField("sparse_csr"):
        csr = msg.sparse_csr
        values = np.frombuffer(csr.values, dtype=dt)
        crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
        col = np.frombuffer(csr.col_indices, dtype=np.int64)
        shape = list(msg.shape)
        if len(shape) != 2:
            raise WireError(f"loss_fn_inputs[{name!r}]: a sparse tensor must be 2-D")
        dense = np.zeros(shape, dtype=dt)
        for r in range(shape[0]):
            dense[r, col[crow[r]:crow[r + 1]]] = values[crow[r]:crow[r + 1]]
        return torch.from_numpy(dense)
    arr = np.frombuffer(msg.dense, dtype=dt).copy()
    shape = list(msg.shape) or [arr.size]
    if int(np.prod(shape)) != arr.size:
        raise WireError(f"loss_fn_inputs[{name!r}]: shape {shape} does not hold {arr.size} values")
    return torch.from_numpy(arr.reshape(shape))


def decode_forward_backward(body: bytes) -> FwdBwdRequest:
    """The SDK's ``ForwardBackwardRequest`` protobuf as tensors (text chunks only)."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # noqa: BLE001 - protobuf raises its own DecodeError
        raise WireError(f"not a ForwardBackwardRequest protobuf: {e}") from None
    config: dict[str, float] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        if v.WhichOneof("value") == "text":
            raise WireError(f"loss_fn_config[{k!r}]: text values are not supported")
        config[k] = float(v.number)
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in d.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise WireError(f"datum {i}: {kind} chunks are not supported (text only)")
            tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
        if not tokens:
            raise WireError(f"datum {i}: empty model_input")
        inputs = {name: _tensor(t, name) for name, t in d.loss_fn_inputs.items()}
        for name, t in inputs.items():
            if t.dim() != 1 or t.shape[0] != len(tokens):
                raise WireError(f"datum {i}: loss_fn_inputs[{name!r}] has shape "
                                f"{list(t.shape)}, expected [{len(tokens)}] (one per input token)")
        if "target_tokens" not in inputs:
            raise WireError(f"datum {i}: loss_fn_inputs has no target_tokens")
        data.append(Datum(tokens, inputs))
    if not data:
        raise WireError("forward_backward with no data")
    return FwdBwdRequest(msg.model_id, int(msg.seq_id), msg.loss_fn, config, data,
                         bool(msg.forward_only))


def _batched(arrays: list[np.ndarray], dtype: int) -> pb.BatchedTensor:
    bt = pb.BatchedTensor()
    bt.dtype = dtype
    bt.data = b"".join(a.tobytes() for a in arrays)
    # a Python running sum: np.cumsum on a list of 8 showed up in a py-spy profile
    bt.offsets = np.array(list(itertools.accumulate((a.nbytes for a in arrays), initial=0)),
                          dtype=np.int64).tobytes()
    return bt


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]],
                                   metrics: dict[str, float]) -> bytes:
    """Per-datum float32 outputs (``logprobs``, ...) and the call's metrics as the SDK's
    ``ForwardBackwardOutput`` protobuf (one batched ``ArrayRecord``)."""
    msg = pb.ForwardBackwardOutput()
    msg.loss_fn_output_type = "ArrayRecord"
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    if outputs:
        rec = msg.loss_fn_outputs.add()
        rec.num_datums = len(outputs)
        for name in outputs[0]:
            rec.fields[name].CopyFrom(_batched(
                [np.ascontiguousarray(o[name], dtype=np.float32) for o in outputs],
                pb.DTYPE_FLOAT32))
    return msg.SerializeToString()


@dataclass
class Sequence:
    tokens: list[int]
    logprobs: list[float]
    stop: bool  # True: an EOS or stop token ended it; False: max_tokens did


def encode_sample_response(seqs: list[Sequence], prompt_logprobs: list[float] | None) -> bytes:
    """Sampled sequences (and the prompt's log-probs, NaN where none: position 0) as the SDK's
    ``SampleResponse`` protobuf."""
    msg = pb.SampleResponse()
    for s in seqs:
        out = msg.sequences.add()
        out.stop_reason = pb.STOP_REASON_STOP if s.stop else pb.STOP_REASON_LENGTH
        out.tokens = np.asarray(s.tokens, dtype=np.int32).tobytes()
        out.logprobs = np.asarray(s.logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return msg.SerializeToString()

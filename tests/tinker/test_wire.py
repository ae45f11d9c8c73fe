"""The protobuf wire against the SDK's own encoder and decoders (``tinker.proto``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker.proto.response_conv import (  # noqa: E402
    deserialize_forward_backward_output,
    deserialize_sample_response,
)

from arealite.tinker.wire import (  # noqa: E402
    Sequence,
    WireError,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)


def _request(data, loss_fn="ppo", config=None) -> bytes:
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn,
                                                          loss_fn_config=config),
        model_id="m-1", seq_id=3)
    msg = forward_backward_request_to_proto(req)
    msg.forward_only = True
    return msg.SerializeToString()


def test_forward_backward_request_round_trip():
    d1 = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]),
                     loss_fn_inputs={"target_tokens": [6, 7, 8], "logprobs": [-1.0, -2.0, -3.0],
                                     "advantages": np.array([0.5, 0.5, 0.5], np.float32)})
    d2 = types.Datum(model_input=types.ModelInput.from_ints([9, 10]),
                     loss_fn_inputs={"target_tokens": torch.tensor([10, 11]),
                                     "logprobs": [-0.5, -0.25], "advantages": [1.0, -1.0]})
    req = decode_forward_backward(_request([d1, d2], config={"clip_low_threshold": 0.7}))
    assert (req.model_id, req.seq_id, req.loss_fn, req.forward_only) == ("m-1", 3, "ppo", True)
    assert req.loss_fn_config == {"clip_low_threshold": pytest.approx(0.7)}
    assert [d.tokens for d in req.data] == [[5, 6, 7], [9, 10]]
    assert req.data[0].inputs["target_tokens"].tolist() == [6, 7, 8]
    assert req.data[1].inputs["advantages"].tolist() == [1.0, -1.0]
    assert req.data[0].inputs["logprobs"].dtype == torch.float32


def test_bad_requests_are_wire_errors():
    short = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]),
                        loss_fn_inputs={"target_tokens": [6, 7]})
    with pytest.raises(WireError, match="expected \\[3\\]"):
        decode_forward_backward(_request([short]))
    no_targets = types.Datum(model_input=types.ModelInput.from_ints([5]),
                             loss_fn_inputs={"weights": [1.0]})
    with pytest.raises(WireError, match="target_tokens"):
        decode_forward_backward(_request([no_targets]))
    with pytest.raises(WireError, match="protobuf"):
        decode_forward_backward(b"\xff\xff\xff not a message")


def test_outputs_decode_with_the_sdk():
    outs = [{"logprobs": np.array([-1.0, -2.5], np.float32)},
            {"logprobs": np.array([-0.5], np.float32)}]
    got = deserialize_forward_backward_output(
        encode_forward_backward_output(outs, {"loss:sum": 4.0}))
    assert got.metrics == {"loss:sum": 4.0}
    assert [o["logprobs"].tolist() for o in got.loss_fn_outputs] == [[-1.0, -2.5], [-0.5]]

    seqs = [Sequence([3, 4], [-0.25, -0.5], stop=True), Sequence([7], [-1.0], stop=False)]
    resp = deserialize_sample_response(encode_sample_response(seqs, [float("nan"), -2.0]))
    assert [s.tokens for s in resp.sequences] == [[3, 4], [7]]
    assert [s.stop_reason for s in resp.sequences] == ["stop", "length"]
    assert resp.sequences[0].logprobs == [-0.25, -0.5]
    assert resp.prompt_logprobs == [None, -2.0]

"""/generate bodies and response parsing against the protocol (and SGLang's own wire types
when they are installed), plus the error-shape parser."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.backends.sglang import (
    SAMPLING_KEYS,
    ProtocolError,
    encode_generate_body,
    generate_payload,
    parse_generate_response,
    parse_version,
    sampling_params,
    token_versions,
)
from arealite.utils.http import error_message
from tests.support.sglang_types import load_api_types


def sglang_api_types():
    """SGLang's wire types without its runtime (``tests.support.sglang_types``)."""
    api_types = load_api_types()
    if api_types is None:
        pytest.skip("sglang wire types not installed (pip install --no-deps sglang msgspec)")
    return api_types


def response(ids, lps=None, finish=None, version="3", spans=None):
    meta = {
        "id": "r",
        "finish_reason": finish or {"type": "length", "length": len(ids)},
        "prompt_tokens": 2,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "weight_version": version,
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps or [-0.5] * len(ids), ids)],
    }
    if spans is not None:
        meta["weight_versions"] = spans
    return {"text": "", "output_ids": ids, "meta_info": meta}


def test_sampling_params_only_valid_keys():
    g = GenerationHyperparameters(
        max_new_tokens=10, min_new_tokens=4, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1,
        stop_token_ids=[7], stop=["\n\n"], frequency_penalty=0.5, ignore_eos=True,
    )
    p = sampling_params(g, max_new_tokens=6, generated=4 - 1)
    assert set(p) <= SAMPLING_KEYS
    assert p["max_new_tokens"] == 6 and p["min_new_tokens"] == 1
    assert p["temperature"] == 0.7 and p["top_k"] == 5 and p["stop_token_ids"] == [7]
    assert "min_new_tokens" not in sampling_params(g, 6, generated=4)
    for key in ("json_schema", "regex", "ebnf"):  # a grammar goes as SGLang's own key
        assert sampling_params(GenerationHyperparameters(**{key: "x"}), 3)[key] == "x"
    with pytest.raises(ValueError, match="at most one"):
        GenerationHyperparameters(json_schema="{}", regex="a")
    greedy = sampling_params(GenerationHyperparameters(greedy=True, temperature=0.9), 3)
    assert greedy["temperature"] == 0.0
    assert "stop" not in greedy and "frequency_penalty" not in greedy


def test_payload_passes_sglang_contract_gate():
    api = sglang_api_types()
    g = GenerationHyperparameters(max_new_tokens=8, min_new_tokens=2, stop=["x"], stop_token_ids=[3])
    body = generate_payload([1, 2, 3], g, 8, "rid-1")
    req = api.GenerateRequest.from_json_value(body)
    assert req.input_ids == [1, 2, 3] and req.return_logprob is True
    with pytest.raises(api.JsonContractError):  # the gate does reject bad keys
        api.GenerateRequest.from_json_value({**body, "sampling_params": {"logprobs": 1}})


gconfigs = st.builds(
    lambda mx, extra, **kw: GenerationHyperparameters(
        max_new_tokens=mx + extra, min_new_tokens=min(kw.pop("min_new"), mx + extra), **kw
    ),
    mx=st.integers(0, 64), extra=st.integers(0, 64), min_new=st.integers(0, 8),
    greedy=st.booleans(), temperature=st.floats(0, 5) | st.just(float("inf")),
    top_p=st.floats(1e-6, 1.0), top_k=st.just(-1) | st.integers(1, 100),
    min_p=st.floats(0, 1), ignore_eos=st.booleans(),
    frequency_penalty=st.floats(-2, 2) | st.just(0.0),
    stop_token_ids=st.lists(st.integers(0, 1000), max_size=3),
    stop=st.none() | st.lists(st.text(max_size=4), max_size=2),
    regex=st.none() | st.text(max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(
    g=gconfigs,
    ids=st.lists(st.integers(0, 2**40), min_size=1, max_size=40) | st.tuples(st.integers(0, 9)),
    rid=st.text(min_size=1, max_size=12),
    generated=st.integers(0, 8),
    lora=st.none() | st.text(min_size=1, max_size=8),
)
def test_encoded_body_is_the_payload(g, ids, rid, generated, lora):
    """The hot path's hand-formatted body is the same JSON value as ``generate_payload``
    (floats, unicode and quotes in rids and stop strings, tuples and inf take the fallback;
    a LoRA adapter's name goes in ``lora_path``)."""
    max_new = max(0, g.max_new_tokens - generated)
    want = json.loads(json.dumps(generate_payload(list(ids), g, max_new, rid, generated, lora)))
    assert ("lora_path" in want) == (lora is not None)
    assert json.loads(encode_generate_body(ids, g, max_new, rid, generated, None, lora)) == want
    if isinstance(ids, list):  # with the ids already encoded, as agenerate passes them
        ids_json = json.dumps(ids).encode()
        assert json.loads(encode_generate_body(ids, g, max_new, rid, generated, ids_json,
                                               lora)) == want


def test_encoded_body_passes_sglang_contract_gate():
    api = sglang_api_types()
    g = GenerationHyperparameters(max_new_tokens=8, min_new_tokens=2, stop=["x"], stop_token_ids=[3])
    body = json.loads(encode_generate_body([1, 2, 3], g, 8, "rid-1"))
    assert api.GenerateRequest.from_json_value(body).input_ids == [1, 2, 3]
    body = json.loads(encode_generate_body([1, 2, 3], g, 8, "rid-1", lora="run-v3"))
    assert api.GenerateRequest.from_json_value(body).lora_path == "run-v3"


def test_parse_response_with_spans_and_null_logprob():
    body = response(
        [5, 6, 7, 8], lps=[-0.1, None, -0.3, -0.4], version="2",
        spans=[{"version": "1", "start": 0, "end": 3}, {"version": "2", "start": 3, "end": 4}],
    )
    seg = parse_generate_response(body, fallback_version=0)
    assert seg.output_ids == [5, 6, 7, 8]
    assert seg.logprobs[1] == -math.inf and seg.logprobs[0] == pytest.approx(-0.1)
    assert seg.versions == [1, 1, 1, 2]
    assert seg.finish_type == "length"


def test_parse_response_contract_roundtrip():
    api = sglang_api_types()
    body = response([1, 2], spans=[{"version": "0", "start": 0, "end": 2}])
    api.GenerateResponse.from_json_value(body)  # our test bodies have SGLang's shape
    assert parse_generate_response(body, 9).versions == [0, 0]


def test_versions_fall_back_to_weight_version_and_engine_version():
    assert parse_generate_response(response([1, 2, 3], version="4"), 0).versions == [4, 4, 4]
    assert parse_generate_response(response([1, 2], version="default"), 7).versions == [7, 7]
    # spans that do not cover every token: gaps take weight_version
    meta = {"weight_version": "5", "weight_versions": [{"version": "4", "start": 0, "end": 2}]}
    assert token_versions(meta, 4, 0) == [4, 4, 5, 5]
    assert parse_version(" 12 ", 0) == 12 and parse_version(None, 3) == 3
    assert parse_version(True, 3) == 3
    with pytest.raises(ProtocolError):
        token_versions({"weight_versions": [{"version": "1", "start": 2, "end": 1}]}, 3, 0)
    with pytest.raises(ProtocolError):
        token_versions({"weight_versions": [{"start": 0}]}, 3, 0)


@pytest.mark.parametrize(
    "finish,kind",
    [
        ({"type": "stop", "matched": 2}, "stop"),
        ({"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}, "abort"),
        ({"type": "abort", "message": "Abort in waiting queue"}, "abort"),
        ("length", "length"),
    ],
)
def test_finish_reasons(finish, kind):
    seg = parse_generate_response(response([1], finish=finish), 0)
    assert seg.finish_type == kind
    message = finish.get("message") if isinstance(finish, dict) else None
    assert seg.finish_message == (message or "")


def test_list_body_and_malformed_answers():
    assert parse_generate_response([response([4])], 0).output_ids == [4]
    with pytest.raises(ProtocolError, match="list of 2"):
        parse_generate_response([response([4]), response([5])], 0)
    with pytest.raises(ProtocolError, match="finish_reason"):
        parse_generate_response(response([1], finish={"type": "weird"}), 0)
    bad = response([1, 2])
    bad["meta_info"]["output_token_logprobs"].pop()
    with pytest.raises(ProtocolError, match="1 logprob entries for 2"):
        parse_generate_response(bad, 0)
    bad = response([1, 2])
    bad["meta_info"]["output_token_logprobs"][1][1] = 9
    with pytest.raises(ProtocolError, match="token 9"):
        parse_generate_response(bad, 0)
    with pytest.raises(ProtocolError):
        parse_generate_response({"error": "x"}, 0)
    no_fr = response([1])
    no_fr["meta_info"]["finish_reason"] = None
    with pytest.raises(ProtocolError):
        parse_generate_response(no_fr, 0)


@pytest.mark.parametrize(
    "body,msg",
    [
        ({"object": "error", "message": "field required", "type": "Bad Request", "param": None, "code": 400}, "field required"),
        ({"error": "unknown field `logprobs`"}, "unknown field `logprobs`"),
        ({"error": {"message": "Input length (9 tokens) exceeds"}}, "Input length (9 tokens) exceeds"),
        ({"object": "error", "message": "Internal", "type": "503", "param": None, "code": 503}, "Internal"),
        ({"success": False, "message": "Failed to update weights"}, "Failed to update weights"),
        ("Cache not flushed.\n", "Cache not flushed."),
        (b'{"error": "bytes"}', "bytes"),
        ("", "<empty body>"),
        ({"detail": "Not Found"}, "Not Found"),
    ],
)
def test_error_message_shapes(body, msg):
    assert error_message(body) == msg


def test_non_numeric_logprob_is_a_protocol_error():
    bad = response([1, 2])
    bad["meta_info"]["output_token_logprobs"][0][0] = "x"
    with pytest.raises(ProtocolError, match="neither a number nor null"):
        parse_generate_response(bad, 0)

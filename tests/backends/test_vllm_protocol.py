"""The vLLM ``GenerateProtocol``: request bodies vLLM 0.32's ``GenerateRequest`` accepts, and
answers (the shape its ``/inference/v1/generate`` returns) turned into segments."""

from __future__ import annotations

import json

import pytest

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.backends.base import ProtocolError
from arealite.backends.vllm.protocol import VLLM, tied_embeddings


def answer(ids, lps, finish="length", spans=None, token_ids=None):
    content = [{"token_id": t, "logprob": lp, "rank": 1, "top_logprobs": []}
               for t, lp in zip(token_ids or ids, lps)]
    return {"request_id": "generate-tokens-r", "choices": [{
        "index": 0, "finish_reason": finish, "stop_reason": None, "token_ids": ids,
        "weight_versions": spans, "logprobs": {"content": content}}]}


def test_body_is_token_ids_and_vllm_sampling_params():
    g = GenerationHyperparameters(max_new_tokens=9, temperature=0.7, min_new_tokens=4,
                                  stop_token_ids=[3], frequency_penalty=0.5)
    body = json.loads(VLLM.encode_generate_body([1, 2], g, 7, "r-1", generated=2))
    assert body["token_ids"] == [1, 2] and body["request_id"] == "r-1"
    assert body["output_mode"] == "tokens" and body["stream"] is False
    sp = body["sampling_params"]
    assert sp["max_tokens"] == 7 and sp["temperature"] == 0.7 and sp["logprobs"] == 0
    assert sp["min_tokens"] == 2 and sp["stop_token_ids"] == [3] and sp["frequency_penalty"] == 0.5
    assert sp["detokenize"] is False and sp["top_k"] == -1
    greedy = json.loads(VLLM.encode_generate_body([1], g.new(greedy=True), 3, "r"))
    assert greedy["sampling_params"]["temperature"] == 0.0


def test_answer_spans_give_per_token_versions():
    seg = VLLM.parse_generate_response(
        answer([5, 6, 7], [-0.1, -0.2, None], "abort",
               [{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 2, "end": 3}]), 0)
    assert seg.output_ids == [5, 6, 7] and seg.logprobs[:2] == [-0.1, -0.2]
    assert seg.logprobs[2] == float("-inf") and seg.versions == [1, 1, 2]
    assert seg.finish_type == "abort" and seg.weight_version == "2"
    # vLLM's launch label "default" is the engine's version when the request started
    seg = VLLM.parse_generate_response(
        answer([5], [-1.0], "stop", [{"version": "default", "start": 0, "end": 1}]), 4)
    assert seg.versions == [4] and seg.finish_type == "stop"
    assert VLLM.parse_generate_response(answer([], [], "abort"), 3).versions == []


@pytest.mark.parametrize("body, why", [
    ({"error": {"message": "boom"}}, "not a vLLM"),
    (answer([5, 6], [-0.1]), "1 logprob entries for 2"),
    (answer([5, 6], [-0.1, -0.2], token_ids=[5, 9]), "entry 1 is for token 9"),
    (answer([5], [-0.1], "error"), "unknown finish_reason"),
])
def test_malformed_answers_raise(body, why):
    with pytest.raises(ProtocolError, match=why):
        VLLM.parse_generate_response(body, 0)


def test_control_calls(tmp_path):
    assert VLLM.pause_call("abort") == ("/pause?mode=abort", None)
    assert VLLM.pause_call("in_place") == ("/pause?mode=keep", None)
    (tmp_path / "config.json").write_text('{"tie_word_embeddings": false}')
    calls = VLLM.disk_update_calls(str(tmp_path), 3, True)
    assert calls == [("/collective_rpc", {"method": "reload_weights",
                                          "kwargs": {"weights_path": str(tmp_path)}}),
                     ("/update_weight_version", {"new_version": "3"})]
    (tmp_path / "config.json").write_text('{"tie_word_embeddings": true}')
    assert tied_embeddings(str(tmp_path))
    with pytest.raises(ValueError, match="stale"):
        VLLM.disk_update_calls(str(tmp_path), 3, True)


@pytest.mark.integration
def test_a_server_without_vllms_endpoints_is_one_clear_error(tiny_model_dir):
    """The client's start-up check: another server (here our embedded one, as a vLLM of
    another version or started without the dev-mode flags would) names what it lacks."""
    from arealite.api.config.rollout import InferenceEngineConfig
    from arealite.rollout.health import BackendMismatch
    from arealite.rollout.remote_engine import RemoteInferenceEngine
    from tests.support.procs import embedded_server

    with embedded_server(tiny_model_dir) as addr:
        eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=30), protocol=VLLM)
        with pytest.raises(BackendMismatch) as e:
            eng.initialize([addr])
    msg = str(e.value)
    assert "vllm protocol" in msg and "GET /weight_info -> HTTP 404" in msg
    assert "POST /inference/v1/generate -> HTTP 404" in msg and "VLLM_SERVER_DEV_MODE=1" in msg

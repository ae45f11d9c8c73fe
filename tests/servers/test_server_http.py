"""One embedded server process, checked over HTTP against SGLang's own wire types."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
import torch

from tests.support.http_calls import gen, post

pytestmark = pytest.mark.integration




def test_generate_validates_against_sglang_contract(server, api_types):
    bodies = [
        {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8, "temperature": 0},
         "return_logprob": True, "rid": "c1"},
        {"text": "1+2=", "sampling_params": {"max_new_tokens": 4, "top_p": 0.9, "top_k": 20},
         "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
         "return_text_in_logprobs": True},
        {"input_ids": [[5, 6], [7]], "sampling_params": {"max_new_tokens": 3, "n": 2},
         "return_logprob": True},
        {"input_ids": [9], "sampling_params": {"max_new_tokens": 0}, "return_prompt_token_ids": True},
    ]
    for body in bodies:
        api_types.GenerateRequest.from_json_value(body)  # our test bodies are valid SGLang bodies
        out = gen(server, body)
        items = out if isinstance(out, list) else [out]
        for item in items:
            resp = api_types.GenerateResponse.from_json_value(item)
            meta = resp.meta_info
            assert len(resp.output_ids) == meta.completion_tokens
            assert meta.weight_version == "default"
            assert meta.weight_versions[-1].end == meta.completion_tokens
            if body.get("return_logprob"):
                assert len(meta.output_token_logprobs) == len(resp.output_ids)
                assert [e.token_id for e in meta.output_token_logprobs] == resp.output_ids
    single = gen(server, bodies[0])
    assert single["meta_info"]["id"] == "c1"
    assert single["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    with_prompt = gen(server, bodies[1])
    assert with_prompt["meta_info"]["input_token_logprobs"][0][0] is None
    assert len(with_prompt["meta_info"]["output_top_logprobs"][0]) == 2
    n_out = gen(server, bodies[2])
    assert isinstance(n_out, list) and len(n_out) == 4
    assert gen(server, bodies[3])["prompt_token_ids"] == [9]


def test_logprobs_match_teacher_forced_forward(server, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    for temperature in (1.0, 0.6):
        out = gen(server, {"input_ids": [[3, 4, 5, 6], [7, 8]], "return_logprob": True,
                           "sampling_params": {"max_new_tokens": 24, "temperature": temperature,
                                               "top_p": 0.95, "ignore_eos": True}})
        for prompt, item in zip([[3, 4, 5, 6], [7, 8]], out):
            ids = torch.tensor([prompt + item["output_ids"]])
            with torch.no_grad():
                lp = torch.log_softmax(model(ids).logits[0] / temperature, -1)
            ref = [lp[len(prompt) - 1 + j, t].item() for j, t in enumerate(item["output_ids"])]
            got = [e[0] for e in item["meta_info"]["output_token_logprobs"]]
            assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-5


def test_stream_is_cumulative_and_ends_with_done(server, api_types):
    r = requests.post(f"{server}/generate", json={
        "input_ids": [5, 6], "stream": True, "return_logprob": True,
        "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}},
        stream=True, timeout=60)
    lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == b"data: [DONE]"
    chunks = [json.loads(ln[len(b"data: "):]) for ln in lines[:-1]]
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    for c in chunks:
        api_types.GenerateResponse.from_json_value(c)
    assert chunks[-1]["output_ids"][:3] == chunks[2]["output_ids"]


@pytest.mark.parametrize("body,shape,fragment", [
    ({"input_ids": [1], "sampling_params": {"logprobs": 1}}, "contract", "unknown field `logprobs`"),
    ({"input_ids": [1], "sampling_params": {"temperature": "hot"}}, "contract", "expected f64"),
    ({"input_ids": []}, "value", "input_ids cannot be empty."),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "value", "top_p must be in"),
    ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "value", "top_k must be -1"),
    ({"input_ids": [1] * 600}, "value", "longer than the model's context length"),
    ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 5}, "value",
     "logprob_start_len (5) is larger"),
    ({"input_ids": "x"}, "validation", "validation error"),
    ({"text": 5}, "validation", "validation error"),
])
def test_bad_input_gets_sglang_error_shapes(server, body, shape, fragment):
    r = post(server, "/generate", body)
    assert r.status_code == 400, r.text
    err = r.json()
    if shape == "contract":
        assert isinstance(err["error"], str) and fragment in err["error"]
    elif shape == "value":
        assert fragment in err["error"]["message"]
    else:
        assert err["object"] == "error" and err["code"] == 400 and fragment in err["message"]


def test_malformed_json_and_empty_bodies_are_400(server):
    h = {"Content-Type": "application/json"}
    for path in ("/generate", "/pause_generation", "/update_weights_from_disk", "/abort_request"):
        for data in (b"{not json", b""):
            r = requests.post(f"{server}{path}", data=data, headers=h, timeout=30)
            assert r.status_code == 400, (path, data, r.text)
            assert r.json()["object"] == "error"
    assert requests.get(f"{server}/health", timeout=5).status_code == 200


def wait_running(server, n=1, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = requests.get(f"{server}/server_info", timeout=10).json()["internal_states"][0]
        if st["num_running_reqs"] >= n:
            return
        time.sleep(0.02)
    raise AssertionError("requests never started running")


def test_abort_request_by_rid_prefix_returns_partial_output(server):
    rids = ["long-job", "long-job-b"] + [f"other-{i}" for i in range(30)]
    result = {}

    def long_call():
        result["out"] = gen(server, {"input_ids": [[3, 4]] * len(rids), "rid": rids,
                                     "sampling_params": {"max_new_tokens": 500, "ignore_eos": True},
                                     "return_logprob": True})

    t = threading.Thread(target=long_call)
    t.start()
    wait_running(server, len(rids))
    # No live request is exactly "long" (SGLang forwards only exact matches): ignored.
    assert post(server, "/abort_request", {"rid": "long"}).status_code == 200
    r = post(server, "/abort_request", {"rid": "long-job"})  # then matches by prefix
    assert r.status_code == 200 and r.text == ""
    t.join(60)
    outs = result["out"]
    for out in outs[:2]:
        fr = out["meta_info"]["finish_reason"]
        assert fr == {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        assert 0 < len(out["output_ids"]) < 500
        assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])
        assert out["meta_info"]["weight_versions"][-1]["end"] == len(out["output_ids"])
    assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs[2:])


def test_health_stays_fast_while_generating(server):
    stop = threading.Event()

    def load():
        while not stop.is_set():
            gen(server, {"input_ids": [[3, 4]] * 16,
                         "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}})

    t = threading.Thread(target=load)
    t.start()
    try:
        time.sleep(0.3)
        worst = 0.0
        for _ in range(20):
            t0 = time.perf_counter()
            assert requests.get(f"{server}/health", timeout=5).status_code == 200
            worst = max(worst, time.perf_counter() - t0)
        assert worst < 0.5, worst
        assert requests.get(f"{server}/health_generate", timeout=30).status_code == 200
    finally:
        stop.set()
        t.join(60)


def test_info_endpoints(server, api_types):
    mi = requests.get(f"{server}/model_info", timeout=10).json()
    api_types.GetModelInfoResponse.from_json_value(mi)
    assert mi["weight_version"] == "default" and mi["is_generation"] is True
    assert requests.get(f"{server}/get_model_info", timeout=10).json() == mi
    si = requests.get(f"{server}/server_info", timeout=10).json()
    api_types.GetServerInfoResponse.from_json_value(si)
    assert si["tp_size"] == 1 and si["dp_size"] == 1 and si["context_length"] == 512
    assert requests.get(f"{server}/get_server_info", timeout=10).status_code == 200
    assert requests.get(f"{server}/metrics", timeout=10).status_code == 404  # not enabled
    flush = post(server, "/flush_cache")
    assert flush.status_code == 200 and flush.text.startswith("Cache flushed.")
    w = requests.post(f"{server}/get_weights_by_name",
                      json={"name": "model.norm.weight", "truncate_size": 5}, timeout=10)
    assert w.status_code == 200 and len(w.json()) == 5
    bad = requests.post(f"{server}/get_weights_by_name", json={"name": "nope"}, timeout=10)
    assert bad.status_code == 400 and bad.json() == {"error": {"message": "Get parameter by name failed"}}
    assert requests.get(f"{server}/openapi.json", timeout=10).status_code == 200


def test_api_keys_and_metrics(tiny_model_dir):
    from tests.support.procs import embedded_server

    args = ["--api-key", "user", "--admin-api-key", "admin", "--enable-metrics"]
    with embedded_server(str(tiny_model_dir), args) as addr:
        base = f"http://{addr}"
        body = {"input_ids": [3], "sampling_params": {"max_new_tokens": 2}}
        assert requests.post(f"{base}/generate", json=body, timeout=30).status_code == 401
        ok = requests.post(f"{base}/generate", json=body, timeout=30,
                           headers={"Authorization": "Bearer user"})
        assert ok.status_code == 200
        for key, code in (("user", 401), ("admin", 200)):
            r = requests.post(f"{base}/update_weight_version", json={"new_version": "7"},
                              headers={"Authorization": f"Bearer {key}"}, timeout=30)
            assert r.status_code == code
        m = requests.get(f"{base}/metrics", timeout=10)
        assert m.status_code == 200 and "sglang:generation_tokens_total" in m.text
        assert "sglang:num_running_reqs" in m.text
        assert requests.get(f"{base}/health", timeout=10).status_code == 200


def test_closing_a_stream_aborts_its_request(server):
    def aborted():
        st = requests.get(f"{server}/server_info", timeout=10).json()["internal_states"][0]
        return st["num_aborted_requests_total"]

    before = aborted()
    r = requests.post(f"{server}/generate", stream=True, timeout=60, json={
        "input_ids": [[3, 4]] * 8, "stream": True,
        "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}})
    lines = r.iter_lines()
    assert next(ln for ln in lines if ln).startswith(b"data: {")
    r.close()  # the client goes away mid-stream
    deadline = time.time() + 10
    while time.time() < deadline:
        st = requests.get(f"{server}/server_info", timeout=10).json()["internal_states"][0]
        if st["num_running_reqs"] == 0 and st["num_queue_reqs"] == 0:
            break
        time.sleep(0.05)
    assert st["num_running_reqs"] == 0 and st["num_queue_reqs"] == 0
    assert aborted() - before == 8  # cut short, not run to the end


def test_a_generation_server_does_not_score(server):
    # SGLang's answer to an EmbeddingReqInput on a generation model (its tokenizer manager)
    r = requests.post(server + "/classify", json={"input_ids": [1, 2, 3]}, timeout=30)
    assert r.status_code == 400 and "--is-embedding" in r.text, r.text


def test_lora_endpoints_without_enable_lora(server):
    """A server started without --enable-lora refuses adapters with SGLang's message."""
    r = post(server, "/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"})
    assert r.status_code == 400 and "--enable-lora" in r.json()["error_message"]
    r = post(server, "/generate", {"input_ids": [5, 6], "lora_path": "a",
                                   "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "--enable-lora" in r.text

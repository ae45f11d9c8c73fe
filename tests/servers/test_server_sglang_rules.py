"""SGLang rules that a real client (AReaL's) found our server breaking, checked over HTTP.

Each test names the SGLang 0.5.23 source that decides the behaviour.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests
import torch

from tests.support.http_calls import gen, post

pytestmark = pytest.mark.integration




def test_greedy_request_after_sampled_ones_is_greedy(server, tiny_model_dir):
    """A finished request's settings never leak into the next one (the engine cached per-row
    settings under ``id()`` of sequences, which Python reuses once one is freed)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    prompt = [3, 7, 11, 5]
    greedy = {"input_ids": prompt, "return_logprob": True,
              "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
    hot = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 2.0,
                                                    "top_k": 50, "ignore_eos": True}}
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(8):
            nxt = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], 1)
        lp = torch.log_softmax(model(ids).logits[0], -1)
    want = ids[0, len(prompt):].tolist()
    want_lp = [lp[len(prompt) - 1 + j, t].item() for j, t in enumerate(want)]
    for _ in range(30):
        gen(server, hot)
        out = gen(server, greedy)
        assert out["output_ids"] == want
        got = [e[0] for e in out["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got, want_lp)) < 1e-4


def test_ignore_eos_turns_off_stop_token_ids(server):
    """SGLang's ``Req._check_token_based_finish`` returns False first thing under ignore_eos,
    so stop_token_ids (which AReaL always fills with EOS and pad) stop nothing."""
    sp = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    probe = gen(server, {"input_ids": [4, 9, 2], "sampling_params": sp})["output_ids"]
    stop = probe[2]
    out = gen(server, {"input_ids": [4, 9, 2],
                       "sampling_params": {**sp, "stop_token_ids": [stop]}})
    assert out["output_ids"] == probe
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
    stopped = gen(server, {"input_ids": [4, 9, 2],
                           "sampling_params": {**sp, "ignore_eos": False, "stop_token_ids": [stop]}})
    assert stopped["output_ids"] == probe[: probe.index(stop) + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_max_new_tokens_past_the_context_is_400(server):
    """``TokenizerManager._validate_one_request``: a given max_new_tokens with
    input + max_new_tokens > context_len is a ValueError (400) without --allow-auto-truncate."""
    r = post(server, "/generate", {"input_ids": [5] * 10, "sampling_params": {"max_new_tokens": 16384}})
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert msg.startswith("Requested token count exceeds the model's maximum context length of "
                          "512 tokens. You requested a total of 16394 tokens: 10 tokens from "
                          "the input messages and 16384 tokens for the completion.")
    # Exactly filling the context is allowed; null means "until the context is full".
    ok = gen(server, {"input_ids": [5] * 10, "sampling_params": {"max_new_tokens": 502,
                                                                 "ignore_eos": True}})
    assert ok["meta_info"]["finish_reason"]["type"] == "length"
    null = gen(server, {"input_ids": [5] * 500, "sampling_params": {"max_new_tokens": None,
                                                                    "ignore_eos": True}})
    assert null["meta_info"]["finish_reason"]["type"] == "length"
    # The default (128, not given) is clipped silently, as in SGLang.
    default = gen(server, {"input_ids": [5] * 500, "sampling_params": {"ignore_eos": True}})
    assert 0 < len(default["output_ids"]) < 128


def test_allow_auto_truncate_cuts_instead(tiny_model_dir):
    from tests.support.procs import embedded_server

    args = ["--context-length", "32", "--allow-auto-truncate", "--random-seed", "0"]
    with embedded_server(str(tiny_model_dir), args) as addr:
        server = f"http://{addr}"
        out = gen(server, {"input_ids": [5] * 10,
                           "sampling_params": {"max_new_tokens": 16384, "ignore_eos": True}})
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        assert 0 < len(out["output_ids"]) <= 32 - 10
        long = gen(server, {"input_ids": [5] * 40, "sampling_params": {"max_new_tokens": 4}})
        assert long["meta_info"]["prompt_tokens"] < 32 and long["output_ids"] == []


def test_release_and_resume_memory_occupation(server):
    """``/release_memory_occupation`` and ``/resume_memory_occupation`` (GET and POST, optional
    tags). Release needs an idle server; generation waits while memory is released."""
    for method in ("GET", "POST"):
        r = requests.request(method, f"{server}/release_memory_occupation", timeout=30)
        assert r.status_code == 200 and r.json() is None, r.text
        r = requests.request(method, f"{server}/resume_memory_occupation", timeout=30)
        assert r.status_code == 200 and r.json() is None, r.text
    # Tags one at a time; a tag that is not released cannot be resumed; unknown tags are 400.
    assert post(server, "/release_memory_occupation", {"tags": ["kv_cache"]}).status_code == 200
    bad = post(server, "/resume_memory_occupation", {"tags": ["weights"]})
    assert bad.status_code == 400 and "not released" in bad.json()["error"]["message"]
    assert post(server, "/release_memory_occupation", {"tags": ["weights"]}).status_code == 200
    unknown = post(server, "/release_memory_occupation", {"tags": ["gpu"]})
    assert unknown.status_code == 400 and "kv_cache" in unknown.json()["error"]["message"]
    # A request sent while released waits, and runs after the resume.
    box: dict = {}
    body = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
    t = threading.Thread(target=lambda: box.setdefault("r", post(server, "/generate", body)))
    t.start()
    time.sleep(1.0)
    assert "r" not in box
    assert post(server, "/resume_memory_occupation", {"tags": ["kv_cache", "weights"]}).status_code == 200
    t.join(30)
    assert box["r"].status_code == 200 and len(box["r"].json()["output_ids"]) == 3
    # Not idle (a request is running; paused in place keeps it there): refused, nothing changes.
    # The request must still be running once paused: on a machine that stalls this thread it can
    # finish between "running" and the pause, and then the server is idle; that try is redone.
    long = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    for _attempt in range(5):
        t = threading.Thread(target=lambda: box.update(long=post(server, "/generate", long)))
        t.start()
        deadline = time.time() + 20
        while requests.get(f"{server}/server_info", timeout=10).json()["internal_states"][0][
                "num_running_reqs"] < 1:
            assert time.time() < deadline, "the request never started running"
            time.sleep(0.01)
        assert post(server, "/pause_generation", {"mode": "in_place"}).status_code == 200
        state = requests.get(f"{server}/server_info", timeout=10).json()["internal_states"][0]
        if state["num_running_reqs"] >= 1:
            break
        assert post(server, "/continue_generation", {}).status_code == 200
        t.join(60)
    else:
        raise AssertionError("the long request ended before every pause")
    busy = post(server, "/release_memory_occupation")
    assert busy.status_code == 400 and "idle" in busy.json()["error"]["message"]
    state = requests.get(f"{server}/server_info", timeout=10).json()["internal_states"][0]
    assert state["memory_released"] == []
    assert post(server, "/continue_generation", {}).status_code == 200
    t.join(60)
    assert box["long"].status_code == 200 and len(box["long"].json()["output_ids"]) == 400

"""The embedded server serving a reward model as SGLang does (``--is-embedding``; ``/classify``
and ``/encode`` with SGLang's ``EmbeddingReqInput`` and its ``{"embedding", "meta_info"}``
answers): scores equal a transformers forward of the same checkpoint to 1e-5, single, batched
and from concurrent clients (which share forwards); a bad request gets a 400 naming the problem
while the requests beside it succeed; a score asked while the server's memory is released waits
for the resume and comes back right; a reward model does not generate (a generation server
does not score: tests/servers/test_server_http.py)."""

from __future__ import annotations

import concurrent.futures as cf
import random

import pytest
import requests
import torch

from tests.support.procs import embedded_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rm_server(tiny_reward_model_dir):
    with embedded_server(str(tiny_reward_model_dir), ["--is-embedding", "--random-seed", "0"]) as a:
        yield f"http://{a}"


@pytest.fixture(scope="module")
def hf_rm(tiny_reward_model_dir):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(
        str(tiny_reward_model_dir), dtype=torch.float32).eval()


def _seqs(hf, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    pad = hf.config.pad_token_id
    out = []
    for _ in range(n):
        s = [rng.randrange(3, hf.config.vocab_size) for _ in range(rng.randint(2, 40))]
        assert s[-1] != pad  # HF pools the last non-pad token, SGLang the last token
        out.append(s)
    return out


def _hf_score(hf, ids: list[int]) -> float:
    with torch.no_grad():
        return float(hf(input_ids=torch.tensor([ids])).logits[0, 0])


def _post(url: str, body, path: str = "/classify") -> requests.Response:
    return requests.post(url + path, json=body, timeout=60)


def test_scores_equal_a_transformers_forward(rm_server, hf_rm, tiny_tokenizer):
    seqs = _seqs(hf_rm, 9)
    want = [_hf_score(hf_rm, s) for s in seqs]
    one = _post(rm_server, {"input_ids": seqs[0], "rid": "a"})
    assert one.status_code == 200, one.text
    body = one.json()
    assert body["meta_info"]["id"] == "a" and body["meta_info"]["prompt_tokens"] == len(seqs[0])
    assert len(body["embedding"]) == 1 and abs(body["embedding"][0] - want[0]) < 1e-5
    for path in ("/classify", "/encode"):  # a padded batch of different lengths
        batch = _post(rm_server, {"input_ids": seqs}, path)
        assert batch.status_code == 200, batch.text
        got = [r["embedding"][0] for r in batch.json()]
        assert max(abs(g - w) for g, w in zip(got, want)) < 1e-5, (got, want)
    text = "What is 12 + 34? #### 46"
    ids = tiny_tokenizer.encode(text)
    r = _post(rm_server, {"text": [text]})
    assert r.status_code == 200 and abs(r.json()[0]["embedding"][0] - _hf_score(hf_rm, ids)) < 1e-5
    info = requests.get(rm_server + "/model_info", timeout=10).json()
    assert info["is_generation"] is False
    assert info["architectures"] == ["Qwen2ForSequenceClassification"]


def test_concurrent_clients_share_forwards(rm_server, hf_rm):
    seqs = _seqs(hf_rm, 24, seed=1)

    def forwards() -> int:
        info = requests.get(rm_server + "/server_info", timeout=10).json()
        return info["internal_states"][0]["score_forwards"]

    before = forwards()
    with cf.ThreadPoolExecutor(12) as pool:
        got = list(pool.map(lambda s: _post(rm_server, {"input_ids": s}), seqs))
    assert forwards() - before < len(seqs)  # requests that arrive during a forward share the next
    for s, r in zip(seqs, got):
        assert r.status_code == 200, r.text
        assert abs(r.json()["embedding"][0] - _hf_score(hf_rm, s)) < 1e-5


BAD = [
    ({"input_ids": []}, "input_ids cannot be empty"),
    ({"input_ids": [[1, 2], []]}, "input_ids cannot be empty (item 1)"),
    ({"input_ids": [1, 10**6]}, "Token ids must be in"),
    ({"input_ids": list(range(5, 10)) * 200}, "longer than the model's context length"),
    ({"input_ids": [1, 2], "text": "x"}, "cannot be provided at the same time"),
    ({}, "At least one of text, input_ids"),
    ({"input_ids": "abc"}, ""),  # schema: FastAPI's validation error, rewritten to 400
    ({"input_ids": [[1, 2], [3, 4]], "rid": ["x", "x"]}, "Duplicate request IDs"),
]


def test_bad_input_is_a_400_and_nothing_else_fails(rm_server, hf_rm):
    seqs = _seqs(hf_rm, 16, seed=2)
    want = [_hf_score(hf_rm, s) for s in seqs]
    with cf.ThreadPoolExecutor(8) as pool:
        good = [pool.submit(_post, rm_server, {"input_ids": seqs[i:i + 4]}) for i in (0, 4, 8, 12)]
        bad = [pool.submit(_post, rm_server, body) for body, _ in BAD]
        for (body, msg), f in zip(BAD, bad):
            r = f.result()
            assert r.status_code == 400, (body, r.status_code, r.text)
            assert msg in r.text, (msg, r.text)
        got = [x["embedding"][0] for f in good for x in f.result().json()]
    assert max(abs(g - w) for g, w in zip(got, want)) < 1e-5


def test_a_reward_model_does_not_generate(rm_server):
    r = requests.post(rm_server + "/generate", timeout=30, json={
        "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "does not generate" in r.text, r.text
    assert requests.get(rm_server + "/health_generate", timeout=30).status_code == 200
    assert requests.get(rm_server + "/health", timeout=10).status_code == 200


def test_a_score_asked_while_the_memory_is_released_waits_for_the_resume(rm_server, hf_rm):
    seq = _seqs(hf_rm, 1, seed=5)[0]
    tags = {"tags": ["weights", "kv_cache"]}
    assert _post(rm_server, tags, "/release_memory_occupation").status_code == 200
    try:
        with cf.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_post, rm_server, {"input_ids": seq})
            with pytest.raises(cf.TimeoutError):
                waiting.result(timeout=1.0)  # held while the weights are away
            assert _post(rm_server, tags, "/resume_memory_occupation").status_code == 200
            r = waiting.result(timeout=60)
    finally:
        _post(rm_server, tags, "/resume_memory_occupation")  # a 400 when already resumed
    assert r.status_code == 200 and abs(r.json()["embedding"][0] - _hf_score(hf_rm, seq)) < 1e-5


def test_is_embedding_needs_a_classifier(tiny_model_dir):
    from servers.engine.model_runner import ModelRunner

    with pytest.raises(ValueError, match="sequence-classification"):
        ModelRunner(str(tiny_model_dir), is_embedding=True)

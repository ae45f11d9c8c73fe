"""``agenerate_group`` (``arealite.rollout.group_generate``) against scripted SGLang-shaped
servers: one batched body per group, per-sample results as ``agenerate`` gives them, a paused
item resumed alone, and the per-sample fallback. (Against a real embedded server:
``test_remote_engine_integration.py``.)"""

from __future__ import annotations

import threading

import pytest

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.io_struct import ModelRequest
from arealite.api.workflow_api import generate_group
from arealite.rollout.remote_engine import GenerationError
from tests.rollout.test_remote_engine import engines, servers  # noqa: F401 - fixtures
from tests.support.scripted_sglang import generate_reply


def batch_reply(body: dict, finish: dict | None = None, n: int | None = None,
                version: str = "0") -> tuple[int, object]:
    """A batch body's answer: each item as ``generate_reply`` answers it alone."""
    if not isinstance(body["input_ids"][0], list):
        return generate_reply(body, n=n, version=version, finish=finish)
    items = [generate_reply({**body, "input_ids": ids, "rid": rid}, n=n, version=version,
                            finish=finish)[1] for ids, rid in zip(body["input_ids"], body["rid"])]
    return 200, items


def group(n: int = 3, new: int = 4, prompt=(5, 6), **g) -> list[ModelRequest]:
    gc = GenerationHyperparameters(max_new_tokens=new, **g)
    return [ModelRequest(rid=f"grp-{i}", input_ids=list(prompt), gconfig=gc.model_copy())
            for i in range(n)]


def run_group(eng, reqs, timeout: float = 30):
    return eng.executor.run_coroutine(generate_group(eng, reqs)).result(timeout)


def test_one_batched_body_and_per_sample_results_as_agenerate_gives_them(servers, engines):  # noqa: F811
    (s,) = servers(1)
    s.on_generate = lambda body, i: batch_reply(body, version="3")
    eng = engines([s])
    eng.set_version(2)
    resps = run_group(eng, group(3, new=4))
    (body,) = s.bodies("/generate")
    assert body["input_ids"] == [[5, 6]] * 3
    assert body["sampling_params"]["max_new_tokens"] == 4  # one dict, for every item
    assert body["return_logprob"] is True and body["logprob_start_len"] == -1
    assert len(set(body["rid"])) == 3 and all(r.startswith(f"grp-{i}-") for i, r in enumerate(body["rid"]))
    single = eng.executor.run_coroutine(eng.agenerate(group(1, new=4)[0])).result(30)
    for r in resps:
        assert (r.input_tokens, r.output_tokens, r.output_logprobs, r.output_versions, r.stop_reason) == (
            single.input_tokens, single.output_tokens, single.output_logprobs, single.output_versions,
            single.stop_reason)
        assert r.output_tokens == [7, 8, 9, 10] and r.output_versions == [3] * 4 and r.server == s.addr
    assert all(st.inflight == 0 for st in eng.pool.servers.values())  # the batch released it


def test_a_paused_item_resumes_alone_with_the_rest(servers, engines):  # noqa: F811
    (s,) = servers(1)

    def script(body, i):
        if i == 0:  # the batch: every item cut after 2 tokens, as a pause in abort mode does
            return batch_reply(body, n=2, finish={"type": "abort", "message": "Aborted"})
        return generate_reply(body, version="1")

    s.on_generate = script
    eng = engines([s])
    eng.pause()
    threading.Timer(0.3, eng.resume).start()
    resps = run_group(eng, group(2, new=5, prompt=(10, 11)))
    batch, *rest = s.bodies("/generate")
    assert len(rest) == 2
    for b in rest:  # prompt + the 2 tokens so far, the remaining 3
        assert b["input_ids"] == [10, 11, 12, 13] and b["sampling_params"]["max_new_tokens"] == 3
        assert b["rid"] not in batch["rid"]
    for r in resps:
        assert r.input_tokens == [10, 11] and r.output_tokens == [12, 13, 14, 15, 16]
        assert r.output_versions == [0, 0, 1, 1, 1] and len(r.output_logprobs) == 5
        assert r.stop_reason == "length"


def test_failed_batch_falls_back_to_one_call_per_sample(servers, engines):  # noqa: F811
    (s,) = servers(1)

    def script(body, i):
        if isinstance(body["input_ids"][0], list):
            return 503, {"error": {"message": "busy"}}
        return generate_reply(body)

    s.on_generate = script
    eng = engines([s], request_retries=1)
    resps = run_group(eng, group(3))
    bodies = s.bodies("/generate")
    assert len(bodies) == 4 and [len(b["input_ids"]) for b in bodies[1:]] == [2, 2, 2]
    assert all(r.output_tokens == [7, 8, 9, 10] for r in resps)


def test_rejected_batch_surfaces_the_4xx_of_a_sample(servers, engines):  # noqa: F811
    (s,) = servers(1)
    s.on_generate = lambda body, i: (400, {"error": "input_ids cannot be empty."})
    eng = engines([s])
    with pytest.raises(GenerationError, match="cannot be empty") as e:
        run_group(eng, group(2))
    assert e.value.status == 400


def test_groups_that_cannot_batch_go_one_by_one(servers, engines):  # noqa: F811
    (s,) = servers(1)
    eng = engines([s])
    mixed = group(2)
    mixed[1].gconfig = mixed[1].gconfig.new(max_new_tokens=2)  # settings differ
    resps = run_group(eng, mixed)
    assert [r.output_len for r in resps] == [4, 2]
    assert all(not isinstance(b["input_ids"][0], list) for b in s.bodies("/generate"))
    imgs = group(2)
    for r in imgs:
        r.image_data = ["data:image/png;base64,AAAA"]
    with pytest.raises(GenerationError):  # the scripted server has no vision: only routing checked
        s.on_generate = lambda body, i: (400, {"error": "no images here"})
        run_group(eng, imgs)
    assert all(not isinstance(b["input_ids"][0], list) for b in s.bodies("/generate"))

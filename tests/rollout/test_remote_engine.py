"""RemoteInferenceEngine against scripted SGLang-shaped servers: request validation, bodies,
interrupted generations, retries, error shapes and the weight-update call sequence.

(Behaviour against real embedded servers: test_remote_engine_integration.py.)
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import pytest

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.io_struct import ModelRequest, ParamSpec, WeightUpdateError, WeightUpdateMeta
from arealite.rollout.remote_engine import GenerationError, RemoteInferenceEngine, parse_addrs
from arealite.utils.network import LOOPBACK, find_free_port
from tests.support.scripted_sglang import ScriptedServer, generate_reply


@pytest.fixture
def servers():
    made: list[ScriptedServer] = []

    def factory(n=2, **kw) -> list[ScriptedServer]:
        new = [ScriptedServer(**kw).start() for _ in range(n)]
        made.extend(new)
        return new

    yield factory
    for s in made:
        s.close()


@pytest.fixture
def engines():
    made: list[RemoteInferenceEngine] = []

    def factory(addrs, **kw) -> RemoteInferenceEngine:
        opts = dict(setup_timeout=10, request_timeout=20, health_check_interval=0.2,
                    weight_update_timeout=10)
        cfg = InferenceEngineConfig(**{**opts, **kw})
        eng = RemoteInferenceEngine(cfg)
        eng.initialize([s.addr for s in addrs] if not isinstance(addrs[0], str) else addrs)
        made.append(eng)
        return eng

    yield factory
    for e in made:
        e.destroy()


def gen(eng: RemoteInferenceEngine, req: ModelRequest, timeout: float = 30):
    return eng.executor.run_coroutine(eng.agenerate(req)).result(timeout)


def req(n=5, prompt=(1, 2, 3), rid="r1", **g) -> ModelRequest:
    return ModelRequest(rid=rid, input_ids=list(prompt), gconfig=GenerationHyperparameters(max_new_tokens=n, **g))


# --------------------------------------------------------------------------- generation


def test_invalid_request_fails_before_any_http(servers, engines):
    (s,) = servers(1)
    eng = engines([s])
    with pytest.raises(ValueError, match="input_ids is empty"):
        gen(eng, ModelRequest(input_ids=[]))
    with pytest.raises(ValueError, match="max_new_tokens"):  # pydantic refuses it at build time
        GenerationHyperparameters(max_new_tokens=-1)
    bad = GenerationHyperparameters.model_construct(**{**GenerationHyperparameters().model_dump(), "max_new_tokens": -1})
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        gen(eng, ModelRequest(input_ids=[1], gconfig=bad))
    with pytest.raises(ValueError, match="non-negative ints"):
        gen(eng, ModelRequest(input_ids=[1, -2]))
    with pytest.raises(ValueError, match="one sample"):
        gen(eng, req(n_samples=2))
    assert "/generate" not in s.paths()


def test_generate_body_and_response(servers, engines):
    (s,) = servers(1, version="3")
    eng = engines([s])
    r = gen(eng, req(n=4, temperature=0.5, stop_token_ids=[9]))
    (body,) = s.bodies("/generate")
    assert body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True
    assert body["sampling_params"]["max_new_tokens"] == 4
    assert body["sampling_params"]["stop_token_ids"] == [9]
    assert body["rid"].startswith("r1-")
    assert r.output_tokens == [4, 5, 6, 7] and r.output_versions == [3, 3, 3, 3]
    assert r.output_logprobs == pytest.approx([-0.01, -0.02, -0.03, -0.04])
    assert r.stop_reason == "length" and r.server == s.addr
    assert 0 < r.ttft <= r.latency


def test_bodies_and_answers_go_through_the_backend_protocol(servers):
    """The backend seam: a protocol object of another shape is all the client needs."""
    from arealite.backends.sglang import SGLANG, SGLangProtocol

    calls = []

    class Recording(SGLangProtocol):  # SGLang's wire format and control calls, counted

        @staticmethod
        def encode_generate_body(*a, **k):
            calls.append("encode")
            return SGLANG.encode_generate_body(*a, **k)

        @staticmethod
        def parse_generate_response(*a, **k):
            calls.append("parse")
            return SGLANG.parse_generate_response(*a, **k)

    (s,) = servers(1)
    eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=10), protocol=Recording())
    eng.initialize([s.addr])
    try:
        assert gen(eng, req(n=2)).output_tokens == [4, 5]
    finally:
        eng.destroy()
    assert calls == ["encode", "parse"]


def test_abort_waits_while_paused_then_resumes_with_the_rest(servers, engines):
    (s,) = servers(1)

    def script(body, i):
        if i == 0:  # cut after 3 tokens, as pause_generation(mode=abort) does
            return generate_reply(body, n=3, version="0", finish={"type": "abort", "message": "Aborted"})
        return generate_reply(body, version="1")

    s.on_generate = script
    eng = engines([s])
    eng.pause()
    threading.Timer(0.5, eng.resume).start()
    t0 = time.monotonic()
    r = gen(eng, req(n=8, prompt=[10, 11]))
    first, second = s.bodies("/generate")
    assert second["input_ids"] == [10, 11, 12, 13, 14]  # prompt + the 3 tokens so far
    assert second["sampling_params"]["max_new_tokens"] == 5
    assert s.calls[-1][2] - t0 >= 0.45  # resubmitted only after resume()
    assert r.output_tokens == [12, 13, 14, 15, 16, 17, 18, 19]
    assert r.output_versions == [0, 0, 0, 1, 1, 1, 1, 1]
    assert len(r.output_logprobs) == 8 and r.stop_reason == "length"
    assert first["rid"] != second["rid"]  # one server-side rid per segment


def test_a_constrained_request_restarts_from_its_prompt_after_an_abort(servers, engines):
    """A grammar sent again would start over at the generated prefix: a paused request with a
    json_schema is regenerated from its prompt, with the grammar, and keeps no aborted token."""
    (s,) = servers(1)

    def script(body, i):
        if i == 0:
            return generate_reply(body, n=3, version="0", finish={"type": "abort", "message": "Aborted"})
        return generate_reply(body, version="1")

    s.on_generate = script
    eng = engines([s])
    r = gen(eng, req(n=6, prompt=[10, 11], json_schema='{"type": "object"}'))
    first, second = s.bodies("/generate")
    assert second["input_ids"] == [10, 11] and second["sampling_params"]["max_new_tokens"] == 6
    assert first["sampling_params"]["json_schema"] == second["sampling_params"]["json_schema"]
    assert r.output_tokens == [12, 13, 14, 15, 16, 17] and r.output_versions == [1] * 6
    assert len(r.output_logprobs) == 6 and first["rid"] != second["rid"]


def test_abort_before_prefill_loops_without_appending(servers, engines):
    (s,) = servers(1)

    def script(body, i):
        if i < 2:
            return generate_reply(body, n=0, finish={"type": "abort", "message": "Abort in waiting queue"})
        return generate_reply(body, version="2")

    s.on_generate = script
    eng = engines([s])
    r = gen(eng, req(n=4))
    bodies = s.bodies("/generate")
    assert len(bodies) == 3
    assert all(b["input_ids"] == [1, 2, 3] and b["sampling_params"]["max_new_tokens"] == 4 for b in bodies)
    assert r.output_tokens == [4, 5, 6, 7] and r.output_versions == [2] * 4


def test_abort_at_the_last_token_finishes_as_length(servers, engines):
    (s,) = servers(1)
    s.on_generate = lambda body, i: generate_reply(body, finish={"type": "abort", "message": "Aborted"})
    eng = engines([s])
    r = gen(eng, req(n=3))
    assert len(s.bodies("/generate")) == 1 and r.stop_reason == "length" and r.output_len == 3


def test_versions_from_spans_and_default_version(servers, engines):
    (s,) = servers(1, version="default")
    eng = engines([s])
    eng.set_version(4)
    r = gen(eng, req(n=2))
    assert r.output_versions == [4, 4]  # "default": the engine's version at request start
    s.on_generate = lambda body, i: generate_reply(
        body, n=3, version="6", spans=[{"version": "5", "start": 0, "end": 1}, {"version": "6", "start": 1, "end": 3}]
    )
    assert gen(eng, req(n=3)).output_versions == [5, 6, 6]


def test_4xx_is_not_retried_and_surfaces_the_message(servers, engines):
    a, b = servers(2)
    for s in (a, b):
        s.on_generate = lambda body, i: (400, {"error": "unknown field `logprobs`, expected one of ..."})
    eng = engines([a, b])
    with pytest.raises(GenerationError, match="unknown field `logprobs`") as e:
        gen(eng, req())
    assert e.value.status == 400
    assert len(a.bodies("/generate")) + len(b.bodies("/generate")) == 1
    assert eng.pool.healthy_addrs() == [a.addr, b.addr]


def test_5xx_is_retried_on_another_server_and_marks_it_unhealthy(servers, engines):
    a, b = servers(2)
    a.on_generate = lambda body, i: (503, {"object": "error", "message": "overloaded", "type": "503", "param": None, "code": 503})
    a.health_status = 200
    eng = engines([a, b], unhealthy_after_failures=2, sticky_rids=False)
    a.health_status = 503
    for i in range(4):
        r = gen(eng, req(rid=f"r{i}"))
        assert r.server == b.addr and r.output_len == 5
    assert len(a.bodies("/generate")) == 2  # two failures, then out of the rotation
    assert eng.pool.unhealthy_addrs() == [a.addr]
    assert "overloaded" in eng.pool.describe()


def test_connection_errors_retry_elsewhere_and_probe_readmits(servers, engines):
    a, b = servers(2)
    eng = engines([a, b], unhealthy_after_failures=1)
    a.stop()  # like a killed process: connection refused
    for i in range(4):
        assert gen(eng, req(rid=f"k{i}")).server == b.addr
    assert eng.pool.unhealthy_addrs() == [a.addr]
    a.restart()
    deadline = time.monotonic() + 5
    while eng.pool.unhealthy_addrs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert eng.pool.healthy_addrs() == [a.addr, b.addr]


def test_timeout_is_retried_on_another_server(servers, engines):
    a, b = servers(2)

    async def hang(body, i):
        await asyncio.sleep(10)
        return generate_reply(body)

    a.on_generate = hang
    eng = engines([a, b], request_timeout=0.5, sticky_rids=False)
    t0 = time.monotonic()
    r = gen(eng, req(rid="slow"))
    assert r.server == b.addr and r.output_len == 5
    assert 0.5 <= time.monotonic() - t0 < 3
    assert eng.pool.servers[a.addr].last_error == "timed out"
    assert len(a.bodies("/generate")) == 1


def test_broken_200_body_is_retried_on_another_server(servers, engines):
    a, b = servers(2)
    a.on_generate = lambda body, i: (200, "<html>proxy error</html>")  # not JSON
    eng = engines([a, b], sticky_rids=False)
    r = gen(eng, req(rid="broken"))
    assert r.server == b.addr and r.output_len == 5
    assert "JSONDecodeError" in eng.pool.servers[a.addr].last_error


def test_cancelling_a_request_propagates_and_releases_its_server(servers, engines):
    (s,) = servers(1)
    started = threading.Event()

    async def hang(body, i):
        started.set()
        await asyncio.sleep(10)
        return generate_reply(body)

    s.on_generate = hang
    eng = engines([s], request_timeout=20)
    fut = eng.executor.run_coroutine(eng.agenerate(req(rid="c")))
    assert started.wait(5)
    fut.cancel()  # a cancellation from elsewhere, not our deadline: no retry, no failure
    with pytest.raises(Exception) as e:
        fut.result(5)
    assert type(e.value).__name__ == "CancelledError"
    st = eng.pool.servers[s.addr]
    deadline = time.monotonic() + 5
    while st.inflight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert st.inflight == 0 and st.consecutive_failures == 0 and st.healthy
    assert len(s.bodies("/generate")) == 1


def test_request_fails_only_after_retries_naming_each_server(servers, engines):
    a, b = servers(2)
    a.on_generate = lambda body, i: (500, {"error": {"message": "CUDA error: out of memory"}})
    b.on_generate = lambda body, i: (502, "Bad Gateway")
    eng = engines([a, b], request_retries=2, unhealthy_after_failures=10)
    with pytest.raises(GenerationError) as e:
        gen(eng, req())
    msg = str(e.value)
    assert "after 3 attempt(s)" in msg
    assert f"{a.addr}: HTTP 500: CUDA error: out of memory" in msg
    assert f"{b.addr}: HTTP 502: Bad Gateway" in msg


def test_initialize_names_unreachable_servers(servers):
    (s,) = servers(1)
    dead = f"{LOOPBACK}:{find_free_port()}"
    eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=1.0))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        eng.initialize([s.addr, dead])
    assert dead in str(e.value) and s.addr not in str(e.value)
    assert time.monotonic() - t0 < 10


def test_addresses_from_argument_config_and_env(monkeypatch, servers, engines):
    a, b = servers(2)
    assert parse_addrs(f"http://{a.addr}, {b.addr}/") == [a.addr, b.addr]
    with pytest.raises(ValueError, match="host:port"):
        parse_addrs("nohost")
    monkeypatch.setenv("AREAL_LLM_SERVER_ADDRS", f"{a.addr},{b.addr}")
    eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=5))
    eng.initialize()
    try:
        assert eng.addresses == [a.addr, b.addr]
    finally:
        eng.destroy()
    monkeypatch.delenv("AREAL_LLM_SERVER_ADDRS")
    with pytest.raises(ValueError, match="AREAL_LLM_SERVER_ADDRS"):
        RemoteInferenceEngine(InferenceEngineConfig()).initialize()


# --------------------------------------------------------------------------- weight updates


def control_calls(s: ScriptedServer) -> list[str]:
    return [p for p in s.paths() if p not in ("/health", "/generate", "/model_info", "/server_info")]


def test_update_ends_a_session_a_dead_trainer_left_open(servers, engines, tmp_path):
    """A trainer SIGKILLed inside an update leaves its servers in a weight-update session
    (found by benchmarks/studies/exactly_once.py): every restarted trainer's update then failed
    at /begin_weight_update until the servers were restarted. The client ends that session
    and begins its own."""
    a, b = servers(2)
    opened = {"a": True}

    def begin(body):
        if opened["a"]:
            return 400, {"success": False, "message": "a weight-update session is already open; "
                         "call end_weight_update() first"}
        opened["a"] = True
        return 200, {"success": True, "message": "Success"}

    def end(body):
        opened["a"] = False
        return 200, {"success": True, "message": "Success"}

    a.on_control["/begin_weight_update"], a.on_control["/end_weight_update"] = begin, end
    eng = engines([a, b])
    meta = WeightUpdateMeta(type="disk", version=1, path=str(tmp_path))
    meta.write_disk_marker()
    assert eng.update_weights(meta).result(10) is None
    assert sorted(eng.last_weight_update.updated) == sorted([a.addr, b.addr])
    assert control_calls(a) == ["/pause_generation", "/begin_weight_update", "/end_weight_update",
                                "/begin_weight_update", "/update_weights_from_disk",
                                "/end_weight_update", "/continue_generation"]
    assert control_calls(b)[1:3] == ["/begin_weight_update", "/update_weights_from_disk"]


def test_disk_update_sequence_waits_for_marker(servers, engines, tmp_path):
    a, b = servers(2)
    b.begin_404 = True  # an older server without weight-update sessions
    eng = engines([a, b], pause_mode="retract")
    meta = WeightUpdateMeta(type="disk", version=1, path=str(tmp_path))
    fut = eng.update_weights(meta)
    time.sleep(0.3)
    assert not fut.done() and control_calls(a) == []  # nothing paused before the files exist
    (tmp_path / "arealite_weights_ready.json").write_text(json.dumps({"version": 0}))  # stale marker
    time.sleep(0.3)
    assert not fut.done()
    meta.write_disk_marker()
    assert fut.result(10) is None
    seq = ["/pause_generation", "/begin_weight_update", "/update_weights_from_disk",
           "/end_weight_update", "/continue_generation"]
    assert control_calls(a) == seq and control_calls(b) == seq
    assert a.bodies("/pause_generation") == [{"mode": "retract"}]
    (disk,) = a.bodies("/update_weights_from_disk")
    assert disk["model_path"] == str(tmp_path) and disk["weight_version"] == "1"
    assert eng.get_version() == 1 and eng.executor.get_version() == 1
    assert sorted(eng.last_weight_update.updated) == sorted([a.addr, b.addr])


def test_failed_server_is_taken_out_and_the_rest_move_on(servers, engines, tmp_path):
    a, b = servers(2)
    b.on_control["/update_weights_from_disk"] = lambda body: (
        400, {"success": False, "message": "Failed to update weights: bad file. Rolling back."}
    )
    eng = engines([a, b])
    meta = WeightUpdateMeta(type="disk", version=2, path=str(tmp_path))
    meta.write_disk_marker()
    eng.update_weights(meta).result(10)
    assert eng.get_version() == 2
    assert eng.pool.healthy_addrs() == [a.addr]
    assert "bad file" in eng.last_weight_update.failed[b.addr]
    assert control_calls(b)[-1] == "/continue_generation"  # never left paused
    assert "/end_weight_update" in control_calls(b)
    # the probe keeps it out: it is up but holds version 0 (no disk re-sync possible: it fails)
    time.sleep(0.6)
    assert eng.pool.unhealthy_addrs() == [b.addr]


def test_probe_resyncs_a_stale_server_from_the_last_disk_update(servers, engines, tmp_path):
    a, b = servers(2)
    eng = engines([a, b])
    meta = WeightUpdateMeta(type="disk", version=1, path=str(tmp_path))
    meta.write_disk_marker()
    eng.update_weights(meta).result(10)
    eng.pool.mark_unhealthy(b.addr, "restarted")
    b.version = "0"  # as if it came back with its launch weights
    deadline = time.monotonic() + 5
    while eng.pool.unhealthy_addrs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert eng.pool.healthy_addrs() == [a.addr, b.addr]
    assert b.bodies("/update_weights_from_disk")[-1]["weight_version"] == "1"


def test_update_times_out_without_marker_and_pauses_nothing(servers, engines, tmp_path):
    (a,) = servers(1)
    eng = engines([a])
    meta = WeightUpdateMeta(type="disk", version=1, path=str(tmp_path), timeout=0.5)
    with pytest.raises(WeightUpdateError, match="arealite_weights_ready.json missing"):
        eng.update_weights(meta).result(10)
    assert control_calls(a) == [] and eng.get_version() == 0


def test_every_server_failing_raises_and_version_stays(servers, engines, tmp_path):
    a, b = servers(2)
    for s in (a, b):
        s.on_control["/update_weights_from_disk"] = lambda body: (400, {"success": False, "message": "nope"})
    eng = engines([a, b])
    meta = WeightUpdateMeta(type="disk", version=1, path=str(tmp_path))
    meta.write_disk_marker()
    with pytest.raises(WeightUpdateError, match="failed on every server"):
        eng.update_weights(meta).result(10)
    assert eng.get_version() == 0
    assert all(control_calls(s)[-1] == "/continue_generation" for s in (a, b))


def test_distributed_sequence_layout_and_buckets(servers, engines):
    a, b = servers(2)
    b.tp_size = 2
    eng = engines([a, b])
    specs = [[ParamSpec("w1", (2, 3), "float32")], [ParamSpec("w2", (4,), "bfloat16"), ParamSpec("b2", (4,), "bfloat16")], [ParamSpec("w3", (1,), "float32")]]
    for version in (1, 2):
        meta = WeightUpdateMeta(type="distributed", version=version, master_port=12345, param_specs=specs)
        eng.update_weights(meta).result(10)
        assert meta.world_size == 4 and meta.backend == "gloo"
        assert eng.get_version() == version
    lay = eng.weight_group_layout()
    assert (lay.world_size, lay.rank_offsets, lay.backend) == (4, {a.addr: 1, b.addr: 2}, "gloo")
    inits_a, inits_b = a.bodies("/init_weights_update_group"), b.bodies("/init_weights_update_group")
    assert len(inits_a) == len(inits_b) == 1  # once, not per update
    assert (inits_a[0]["rank_offset"], inits_b[0]["rank_offset"]) == (1, 2)
    assert inits_a[0]["world_size"] == 4 and inits_a[0]["backend"] == "gloo"
    ups = a.bodies("/update_weights_from_distributed")
    assert len(ups) == 6
    assert [u["flush_cache"] for u in ups[:3]] == [False, False, True]
    assert [u["weight_version"] for u in ups[:3]] == [None, None, "1"]
    assert ups[1]["names"] == ["w2", "b2"] and ups[1]["dtypes"] == ["bfloat16", "bfloat16"]
    assert ups[0]["shapes"] == [[2, 3]] and ups[0]["load_format"] == "flattened_bucket"
    seq = control_calls(a)
    assert seq[:4] == ["/pause_generation", "/begin_weight_update", "/init_weights_update_group", "/update_weights_from_distributed"]
    assert seq[6:8] == ["/end_weight_update", "/continue_generation"]


def test_distributed_world_size_mismatch_is_refused(servers, engines):
    (a,) = servers(1)
    eng = engines([a])
    meta = WeightUpdateMeta(type="distributed", version=1, master_port=1, world_size=5,
                            param_specs=[[ParamSpec("w", (1,), "float32")]])
    with pytest.raises(WeightUpdateError, match="world_size=5 but the servers need 2"):
        eng.update_weights(meta).result(10)
    assert control_calls(a) == []


def test_logprob_null_is_minus_inf(servers, engines):
    (s,) = servers(1)

    def script(body, i):
        status, out = generate_reply(body, n=2)
        out["meta_info"]["output_token_logprobs"][0][0] = None
        return status, out

    s.on_generate = script
    r = gen(engines([s]), req(n=2))
    assert r.output_logprobs[0] == -math.inf


def test_the_client_is_importable_under_the_designs_name():
    import arealite.rollout as rollout
    from arealite.rollout import RemoteSGLangEngine

    assert RemoteSGLangEngine is RemoteInferenceEngine
    with pytest.raises(AttributeError):
        rollout.NoSuchEngine  # noqa: B018

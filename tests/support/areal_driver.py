"""Drives embedded servers with AReaL's own client (``areal`` wheel, its own virtualenv).

Run by ``tests/servers/test_areal_client.py`` as
``.venv-areal/bin/python tests/support/areal_driver.py SPEC.json OUT.json``; it imports nothing
of this project (the two virtualenvs share only HTTP). It records what AReaL's
``RemoteSGLangEngine`` returns; the test checks every number against a teacher-forced recompute
in the main virtualenv. SPEC: ``addrs`` (host:port list), ``new_model`` (a checkpoint with other
weights), ``tokenizer`` (a tokenizer directory), ``vocab`` (its size), ``eos`` (EOS ids), ``name_root`` (a folder for AReaL's
name_resolve records).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import threading
import time
import traceback

import requests
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig, NameResolveConfig
from areal.api.io_struct import ModelRequest, ParamSpec, WeightUpdateMeta
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.utils import name_resolve, names

EXPERIMENT, TRIAL = "conformance", "t0"


def reward_fn(prompt, completion, prompt_ids, completion_ids, **data) -> float:
    return float(str(data.get("answer", "")) in completion)


def record(eng: RemoteSGLangEngine, req: ModelRequest, resp) -> dict:
    sp = eng._engine.backend.build_generation_request(req, with_lora=False, version=0).payload
    return {"prompt": list(req.input_ids), "sp": sp["sampling_params"], "rid": req.rid,
            "output_ids": resp.output_tokens, "logprobs": resp.output_logprobs,
            "versions": resp.output_versions, "stop_reason": resp.stop_reason}


def server_state(addr: str) -> dict:
    return requests.get(f"http://{addr}/server_info", timeout=30).json()["internal_states"][0]


class Loop:
    """An event loop in a thread, so the main thread can pause and update like a trainer."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def greedy(n: int, **kw) -> GenerationHyperparameters:
    return GenerationHyperparameters(max_new_tokens=n, greedy=True, **kw)


async def gen_all(eng, reqs):
    return await asyncio.gather(*(eng.agenerate(r) for r in reqs))


def wait_running(addrs: list[str], n: int, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while sum(server_state(a)["num_running_reqs"] for a in addrs) < n:
        if time.time() > deadline:
            raise TimeoutError(f"fewer than {n} requests ever ran")
        time.sleep(0.01)


def check_generation(eng, loop, out, vocab: int):
    """Greedy after sampled (one request at a time), then a concurrent mix of settings."""
    rng = random.Random(0)
    seq = []
    # AReaL routes round-robin over two servers: two hot requests then two greedy ones put a
    # greedy request right after a temperature-2 one on each server.
    for i in range(15):
        for _ in range(2):
            hot = ModelRequest(input_ids=[3, 7, 11, 5], gconfig=GenerationHyperparameters(
                max_new_tokens=8, temperature=2.0, top_k=50, ignore_eos=True))
            loop.submit(eng.agenerate(hot)).result(120)
        for j in range(2):
            req = ModelRequest(rid=f"greedy-{i}-{j}", input_ids=[3, 7, 11, 5],
                               gconfig=greedy(8, ignore_eos=True))
            seq.append(record(eng, req, loop.submit(eng.agenerate(req)).result(120)))
    out["greedy_after_sampled"] = seq
    reqs = []
    for i in range(40):
        kind = rng.choice(["greedy", "temp", "top_p", "top_k", "penalty"])
        g = dict(max_new_tokens=rng.randint(1, 12), ignore_eos=True)
        if kind == "greedy":
            g["greedy"] = True
        else:
            g["temperature"] = rng.choice([0.5, 0.8, 1.3, 2.0])
            if kind == "top_p":
                g["top_p"] = rng.choice([0.5, 0.9])
            elif kind == "top_k":
                g["top_k"] = rng.choice([2, 10])
            elif kind == "penalty":
                g["frequency_penalty"] = 0.7
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 8))]
        reqs.append(ModelRequest(rid=f"mix-{i}", input_ids=prompt,
                                 gconfig=GenerationHyperparameters(**g)))
    resps = loop.submit(gen_all(eng, reqs)).result(300)
    out["mixed"] = [record(eng, r, s) for r, s in zip(reqs, resps)]


def check_stops(eng, loop, out, eos: list[int]):
    probe_req = ModelRequest(input_ids=[4, 9, 2, 8], gconfig=greedy(12, ignore_eos=True))
    probe = loop.submit(eng.agenerate(probe_req)).result(120).output_tokens
    stop = probe[3]
    res = {"probe": probe, "stop_token": stop}
    r = ModelRequest(input_ids=[4, 9, 2, 8], gconfig=greedy(12, stop_token_ids=[stop]))
    res["stop_token_ids"] = record(eng, r, loop.submit(eng.agenerate(r)).result(120))
    # AReaL's RLVR default: EOS and pad always in stop_token_ids; with ignore_eos nothing stops.
    r = ModelRequest(input_ids=[4, 9, 2, 8], gconfig=greedy(12, ignore_eos=True,
                                                             stop_token_ids=[*eos, stop]))
    res["ignore_eos"] = record(eng, r, loop.submit(eng.agenerate(r)).result(120))
    out["stops"] = res


def check_stop_string(eng, loop, out, tokenizer_dir: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompt = tok.encode("3+4=")
    probe = loop.submit(eng.agenerate(ModelRequest(
        input_ids=prompt, gconfig=greedy(12, ignore_eos=True)))).result(120).output_tokens
    text = tok.decode(probe, skip_special_tokens=True)
    stop = text.strip()[2:4] if len(text.strip()) >= 4 else text.strip()[:1]
    r = ModelRequest(input_ids=prompt, gconfig=greedy(12, ignore_eos=True, stop=[stop]))
    resp = loop.submit(eng.agenerate(r)).result(120)
    out["stop_string"] = {"probe": probe, "probe_text": text, "stop": stop,
                          "result": record(eng, r, resp),
                          "text": tok.decode(resp.output_tokens, skip_special_tokens=True)}


def check_context_error(eng, loop, out):
    r = ModelRequest(input_ids=[5] * 10, gconfig=GenerationHyperparameters(max_new_tokens=16384))
    try:
        loop.submit(eng.agenerate(r)).result(120)
        out["context_error"] = {"raised": False}
    except Exception as e:
        out["context_error"] = {"raised": True, "type": type(e).__name__, "message": str(e)}


def interrupted_run(eng, loop, addrs, prompts, n, during):
    """Greedy requests in flight; pause like a trainer, run ``during()``, continue."""
    reqs = [ModelRequest(rid=f"int-{time.time_ns()}-{i}", input_ids=p, gconfig=greedy(n, ignore_eos=True))
            for i, p in enumerate(prompts)]
    fut = loop.submit(gen_all(eng, reqs))
    wait_running(addrs, 2)
    before = sum(server_state(a)["num_aborted_requests_total"] for a in addrs)
    eng.pause()
    try:
        eng.pause_generation()
        aborted = sum(server_state(a)["num_aborted_requests_total"] for a in addrs) - before
        extra = during()
    finally:  # a failed step must not leave the servers paused for the next one
        eng.continue_generation()
        eng.resume()
    resps = fut.result(300)
    return [record(eng, r, s) for r, s in zip(reqs, resps)], aborted, extra


def check_interruption(eng, loop, addrs, out):
    prompts = [[3 + i, 40 + i, 7] for i in range(12)]  # more than the servers run at once
    ref = loop.submit(gen_all(eng, [ModelRequest(input_ids=p, gconfig=greedy(150, ignore_eos=True))
                                    for p in prompts])).result(300)
    recs, aborted, _ = interrupted_run(eng, loop, addrs, prompts, 150, lambda: None)
    out["interruption"] = {"reference": [r.output_tokens for r in ref], "interrupted": recs,
                           "aborted": aborted}


def check_disk_update(eng, loop, addrs, out, new_model: str):
    prompts = [[5 + i, 60 + i, 9] for i in range(4)]

    def update():
        name_resolve.add(names.update_weights_from_disk(EXPERIMENT, TRIAL, eng.get_version()),
                         str(time.time()), replace=True)
        meta = WeightUpdateMeta(type="disk", path=new_model, clear_checkpoint_after_load=False)
        eng.update_weights_from_disk(meta).result(120)
        eng.set_version(eng.get_version() + 1)
        return [server_state(a)["weight_updates_total"] for a in addrs]

    recs, _, updates = interrupted_run(eng, loop, addrs, prompts, 120, update)
    out["disk_update"] = {"results": recs, "weight_updates_total": updates}


def check_offload(eng, loop, addrs, out):
    eng.pause()
    try:
        eng.pause_generation()
        eng.offload()
        released = [server_state(a).get("memory_released") for a in addrs]
        eng.onload()
        resumed = [server_state(a).get("memory_released") for a in addrs]
    finally:
        eng.continue_generation()
        eng.resume()
    r = ModelRequest(input_ids=[8, 9, 10], gconfig=greedy(10, ignore_eos=True))
    out["offload"] = {"released": released, "resumed": resumed,
                      "after": record(eng, r, loop.submit(eng.agenerate(r)).result(120))}


def check_compute_logp(eng, out):
    import torch

    data = [{"input_ids": torch.tensor([[3, 4, 5, 6, 7, 8]]),
             "loss_mask": torch.tensor([[0, 0, 0, 1, 1, 1]])}]
    try:
        res = eng.compute_logp(data)
        out["compute_logp"] = {"raised": False, "logp": res[0].tolist()}
    except Exception as e:
        out["compute_logp"] = {"raised": True, "type": type(e).__name__, "message": str(e)}


def check_distributed_without_begin(eng, addrs, out):
    """AReaL 1.0.4 posts /update_weights_from_distributed with no /begin_weight_update first."""
    meta = WeightUpdateMeta(type="xccl", nccl_group_name="weight_update_group")
    specs = [ParamSpec(name="lm_head.weight", shape=[4, 4], dtype="float32")]
    reqs = eng._engine.backend.build_distributed_weight_update_requests(meta, specs).requests
    answers = []
    for a in addrs:
        for hr in reqs:
            t0 = time.time()
            r = requests.request(hr.method, f"http://{a}{hr.endpoint}", json=hr.payload, timeout=60)
            answers.append({"endpoint": hr.endpoint, "status": r.status_code, "body": r.json(),
                            "seconds": time.time() - t0})
    out["distributed_without_begin"] = answers


def check_rlvr(eng, out, tokenizer_dir: str):
    from areal.workflow.rlvr import RLVRWorkflow

    wf = RLVRWorkflow(reward_fn=reward_fn, gconfig=GenerationHyperparameters(
        max_new_tokens=6, temperature=1.0, n_samples=1), tokenizer=tokenizer_dir)
    data = [{"messages": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)}
            for a, b in [(1, 2), (3, 4), (2, 2), (5, 1)]]
    trajs = eng.rollout_batch(data, workflow=wf, group_size=2)
    out["rlvr"] = [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in t.items()}
                   for t in trajs]
    out["rlvr_gconfig_stop_token_ids"] = wf.gconfig.stop_token_ids


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    addrs = spec["addrs"]
    name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=spec["name_root"]))
    cfg = InferenceEngineConfig(
        experiment_name=EXPERIMENT, trial_name=TRIAL, backend="sglang:d2", setup_timeout=60,
        request_timeout=120, request_retries=1, pause_grace_period=0.2,
        max_concurrent_rollouts=16, consumer_batch_size=8,
    )
    eng = RemoteSGLangEngine(cfg)
    eng.initialize(addr=addrs)
    loop = Loop()
    out: dict = {"errors": {}}
    steps = [
        ("generation", lambda: check_generation(eng, loop, out, spec["vocab"])),
        ("stops", lambda: check_stops(eng, loop, out, spec["eos"])),
        ("stop_string", lambda: check_stop_string(eng, loop, out, spec["tokenizer"])),
        ("context_error", lambda: check_context_error(eng, loop, out)),
        ("interruption", lambda: check_interruption(eng, loop, addrs, out)),
        ("compute_logp", lambda: check_compute_logp(eng, out)),
        ("distributed_without_begin", lambda: check_distributed_without_begin(eng, addrs, out)),
        ("rlvr", lambda: check_rlvr(eng, out, spec["tokenizer"])),
        # last: these change the servers' weights and memory state
        ("disk_update", lambda: check_disk_update(eng, loop, addrs, out, spec["new_model"])),
        ("offload", lambda: check_offload(eng, loop, addrs, out)),
    ]
    for name, step in steps:
        try:
            step()
        except Exception:  # recorded; the test names the step that failed
            out["errors"][name] = traceback.format_exc()
    loop.close()
    eng.destroy()
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()

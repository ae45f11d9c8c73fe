"""Routed experts from a real embedded MoE server (``--enable-return-routed-experts``) through
the client: single requests and a group in one batched call, cut by a pause and resumed, each
response's rows equal to the routing of a plain forward over its tokens; a response whose
width does not fit the trainer's model fails its request with a clear error."""

from __future__ import annotations

import time

import numpy as np
import pytest
import requests
import torch
from transformers import AutoModelForCausalLM

from arealite.rollout.remote_engine import GenerationError
from servers.engine.routed_experts import moe_routers
from tests.rollout.test_remote_engine_integration import make_engine, request, start_all
from tests.support.http_calls import wait_tokens
from tests.support.procs import embedded_server

pytestmark = pytest.mark.integration


def _plain_routing(model, ids: list[int]) -> np.ndarray:
    got: dict[int, torch.Tensor] = {}
    routers = moe_routers(model.model)
    hooks = [
        r.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(i, o[2]))
        for i, r in routers.items()
    ]
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return torch.cat([got[i] for i in sorted(got)], -1).numpy()  # [T, layers * top_k]


def test_routed_experts_survive_pauses_groups_and_joins(tiny_moe_dir):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_moe_dir), dtype=torch.float32)
    with embedded_server(
        str(tiny_moe_dir), ["--random-seed", "0", "--enable-return-routed-experts"]
    ) as addr:
        eng = make_engine([addr])
        try:
            n = 400  # long enough that the pause finds every request still running
            reqs = [
                request(f"s{i}", n, prompt=[5, 6, 7 + i], return_routed_experts=True)
                for i in range(2)
            ]
            reqs += [
                request(f"g{i}", n, prompt=[9, 8, 7], return_routed_experts=True) for i in range(3)
            ]
            first_segment = next(eng._segment_ids)
            fut = start_all(eng, reqs, group=3)
            url = f"http://{addr}"
            # pause once the server has generated tokens (not after a fixed sleep: on a quiet
            # machine the requests could end first, on a loaded one not have started); its
            # num_tokens load is the prompts waiting or held plus the tokens generated since
            wait_tokens(url, sum(len(q.input_ids) for q in reqs) + 2, timeout=120)
            assert requests.post(f"{url}/pause_generation", json={"mode": "abort"}, timeout=30).ok
            time.sleep(0.3)
            assert requests.post(f"{url}/continue_generation", json={}, timeout=30).ok
            out = fut.result(180)
            resumed = next(eng._segment_ids) - first_segment - 1 - len(reqs)
            assert resumed >= 1, "the pause cut no request"
            agree = total = 0
            for q, r in zip(reqs, out):
                ids = q.input_ids + r.output_tokens
                assert r.output_len == n and r.routed_experts.shape == (len(ids) - 1, 4)
                ref = _plain_routing(model, ids[:-1])
                same = [
                    set(a[2 * k : 2 * k + 2]) == set(b[2 * k : 2 * k + 2])
                    for a, b in zip(r.routed_experts.tolist(), ref.tolist())
                    for k in (0, 1)
                ]
                agree, total = agree + sum(same), total + len(same)
            assert agree / total >= 0.98, (
                f"{agree}/{total} token-layers as a plain forward routes them"
            )

            eng.routed_experts_width = 6  # a trainer whose model has 3 MoE layers x top-2
            with pytest.raises(GenerationError, match="4 routed expert ids per token, expected 6"):
                start_all(eng, [request("bad", 4, return_routed_experts=True)]).result(60)
            eng.routed_experts_width = 4
            ok = start_all(eng, [request("good", 4, return_routed_experts=True)]).result(60)[0]
            assert ok.routed_experts.shape == (4 + 4 - 1, 4)
        finally:
            eng.destroy()

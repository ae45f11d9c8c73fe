"""Released memory is really freed: on a CPU server ``/release_memory_occupation`` lowers the
process's RSS by about the weights' size plus the KV cache, and ``/resume_memory_occupation``
brings back exactly the weights it had (a seeded request gives the same tokens and logprobs)."""

from __future__ import annotations

import pytest
import requests

from arealite.utils.memory import rss_mib
from tests.support.procs import embedded_server_proc

pytestmark = pytest.mark.integration


def post(addr: str, path: str, body: dict) -> requests.Response:
    return requests.post(f"http://{addr}{path}", json=body, timeout=60)


def seeded(addr: str) -> dict:
    """Tokens and logprobs of one seeded request (from an empty prefix cache)."""
    assert requests.post(f"http://{addr}/flush_cache", timeout=30).status_code == 200
    body = {"input_ids": [5, 17, 3, 99], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 24, "temperature": 1.0, "sampling_seed": 1234,
                                "ignore_eos": True}}
    out = post(addr, "/generate", body).json()
    assert "output_ids" in out, out
    return {"ids": out["output_ids"],
            "lp": [e[0] for e in out["meta_info"]["output_token_logprobs"]]}


def same(a: dict, b: dict) -> None:
    """The same tokens; logprobs equal up to float noise (the KV cache's row layout may differ
    between two runs of one request: ~5e-7 seen)."""
    assert a["ids"] == b["ids"]
    assert max(abs(x - y) for x, y in zip(a["lp"], b["lp"])) < 1e-5


def test_release_frees_rss_and_resume_restores_the_weights(tiny_model_dir):
    import torch
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM
        n_bytes = sum(p.numel() * 4 for p in AutoModelForCausalLM.from_config(cfg).parameters())
    with embedded_server_proc(str(tiny_model_dir), ["--dtype", "float32"]) as (addr, proc):
        before = seeded(addr)
        same(seeded(addr), before)  # the seed alone decides the sample
        rss0 = rss_mib(proc.pid)
        assert post(addr, "/pause_generation", {"mode": "abort"}).status_code == 200
        assert post(addr, "/release_memory_occupation", {}).status_code == 200
        rss1 = rss_mib(proc.pid)
        freed = rss0 - rss1
        # at least 80% of the weights' bytes went back to the OS
        assert freed > 0.8 * n_bytes / 2**20, (rss0, rss1, n_bytes / 2**20)
        assert post(addr, "/resume_memory_occupation", {}).status_code == 200
        assert post(addr, "/continue_generation", {}).status_code == 200
        same(seeded(addr), before)
        assert rss_mib(proc.pid) > rss1 + 0.8 * n_bytes / 2**20

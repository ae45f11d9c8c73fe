"""A unit-test ``InferenceEngine``: runs the tiny HF model in-process to produce real tokens,
logprobs (of the temperature-scaled distribution) and versions. Only ``agenerate`` and the
version accessors are real; the executor-side methods are not needed by workflows."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import torch

from arealite.api.engine_api import InferenceEngine
from arealite.api.io_struct import ModelRequest, ModelResponse
from servers.engine.model_runner import cache_kwarg


class LocalHFEngine(InferenceEngine):
    def __init__(self, model_dir: str, version: int = 0, seed: int = 0):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
        self._cache_kw = cache_kwarg(self.model.forward)  # "cache" from transformers 5.24
        self.version = version
        self.requests: list[ModelRequest] = []  # every request seen, in order (for assertions)
        self._lock = threading.Lock()
        self._gen = torch.Generator().manual_seed(seed)

    def initialize(self, addr=None, train_data_parallel_size=None) -> None:
        pass

    def _generate(self, req: ModelRequest) -> ModelResponse:
        g = req.gconfig
        t0 = time.monotonic()
        with self._lock, torch.no_grad():
            ids = torch.tensor([req.input_ids])
            out_tokens, out_lp = [], []
            past = None
            stop = set(g.stop_token_ids)
            reason = "length"
            for _ in range(g.max_new_tokens):
                o = self.model(input_ids=ids if past is None else ids[:, -1:], use_cache=True,
                               **{self._cache_kw: past})
                past = getattr(o, self._cache_kw)
                logits = o.logits[0, -1].float()
                if g.greedy or g.temperature == 0:
                    tok = int(torch.argmax(logits))
                    lp = torch.log_softmax(logits, -1)[tok]
                else:
                    logp = torch.log_softmax(logits / g.temperature, -1)
                    tok = int(torch.multinomial(logp.exp(), 1, generator=self._gen))
                    lp = logp[tok]
                out_tokens.append(tok)
                out_lp.append(float(lp))
                ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
                if tok in stop and len(out_tokens) >= g.min_new_tokens:
                    reason = "stop"
                    break
        return ModelResponse(
            input_tokens=list(req.input_ids), output_tokens=out_tokens, output_logprobs=out_lp,
            output_versions=[self.version] * len(out_tokens), stop_reason=reason,
            latency=time.monotonic() - t0, server="local",
        )

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        req.validate()
        self.requests.append(req.copy())
        return await asyncio.to_thread(self._generate, req)

    def update_weights(self, meta):
        raise NotImplementedError("not used by workflow tests")

    def submit(self, data: dict[str, Any], workflow) -> None:
        raise NotImplementedError("not used by workflow tests")

    def wait(self, count, timeout=None, should_accept=None):
        raise NotImplementedError("not used by workflow tests")

    def rollout_batch(self, data, workflow):
        raise NotImplementedError("not used by workflow tests")

    def prepare_batch(self, dataloader, workflow, should_accept=None):
        raise NotImplementedError("not used by workflow tests")

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def set_version(self, version: int) -> None:
        self.version = version

    def get_version(self) -> int:
        return self.version


class ScriptedEngine(LocalHFEngine):
    """Returns given token sequences (to force right/wrong answers deterministically) with
    logprobs scored by the real model, so a multi-turn test can control the answers."""

    def __init__(self, model_dir: str, scripts: list[list[int]], version: int = 0):
        super().__init__(model_dir, version)
        self.scripts = list(scripts)

    def _generate(self, req: ModelRequest) -> ModelResponse:
        toks = self.scripts.pop(0)[: req.gconfig.max_new_tokens]
        with self._lock, torch.no_grad():
            ids = torch.tensor([list(req.input_ids) + toks])
            logp = torch.log_softmax(self.model(input_ids=ids).logits[0].float(), -1)
            n = len(req.input_ids)
            lps = [float(logp[n - 1 + i, t]) for i, t in enumerate(toks)]
        stop = "stop" if toks and toks[-1] in req.gconfig.stop_token_ids else "length"
        return ModelResponse(list(req.input_ids), toks, lps, [self.version] * len(toks), stop)

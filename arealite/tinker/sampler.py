"""Tinker sampling sessions over the server pool: each session is pinned to one weight version
and every request it sends names exactly those weights.

- LoRA: version ``k`` of a model lives on the servers as its own adapter
  (``arealite.weights.adapters``: ``<run>-v<k>``, loaded beside the older ones, never paused),
  and each ``/generate`` call names it in ``lora_path``, so a session created at ``k`` keeps
  sampling ``k`` however many versions are pushed after it.
- Every weight (no LoRA): the servers hold one version. A request's answer carries the version
  that produced it (``meta_info.weight_version``); an answer from any other version is refused
  with a clear error instead of being returned as the session's.
- The base model: no adapter, version 0.

Requests go to the servers in SGLang's protocol (``/generate``, token ids in, log-probs of
output and, for ``compute_logprobs``, prompt tokens out), round robin over the pool.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp

from arealite.tinker.wire import Sequence


@dataclass(frozen=True)
class SamplingSession:
    session_id: str
    base_model: str
    model_id: str | None  # None: the base model
    version: int
    adapter: str | None  # the LoRA adapter that holds ``version`` on the servers
    model_path: str | None  # the tinker:// path it was created from


class SamplingError(RuntimeError):
    """The servers could not answer for the session's weights (a server error: 500)."""


class VersionGone(SamplingError):
    """The servers no longer hold the session's weights (full-weight training moved on)."""


def sampling_params(p: dict[str, Any]) -> dict[str, Any]:
    """Tinker's ``SamplingParams`` as SGLang's: ``stop`` is strings or token ids; ``[]``
    turns off EOS too."""
    out: dict[str, Any] = {
        "max_new_tokens": int(p.get("max_tokens") or 16),
        "temperature": float(p.get("temperature", 1.0)),
        "top_p": float(p.get("top_p", 1.0)),
        "top_k": int(p.get("top_k", -1)),
    }
    if p.get("seed") is not None:
        out["sampling_seed"] = int(p["seed"])
    stop = p.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and len(stop) == 0:
        out["ignore_eos"] = True
    elif stop:
        if all(isinstance(s, int) for s in stop):
            out["stop_token_ids"] = list(stop)
        elif all(isinstance(s, str) for s in stop):
            out["stop"] = list(stop)
        else:
            raise ValueError("sampling_params.stop mixes strings and token ids")
    return out


class PoolSampler:
    """Sends a session's requests to the servers and shapes the answers as Tinker's."""

    def __init__(self, addrs: list[str], headers: dict[str, str], timeout: float) -> None:
        if not addrs:
            raise ValueError("the sampler needs at least one server address")
        self.addrs = list(addrs)
        self.headers = headers
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._next = itertools.cycle(range(len(self.addrs)))
        self._http: aiohttp.ClientSession | None = None

    async def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(headers=self.headers, timeout=self.timeout)
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def _generate(self, sess: SamplingSession, body: dict[str, Any]) -> dict[str, Any]:
        if sess.adapter is not None:
            body["lora_path"] = sess.adapter
        addr = self.addrs[next(self._next)]
        http = await self._session()
        async with http.post(f"http://{addr}/generate", json=body) as r:
            text = await r.text()
            if r.status != 200:
                raise SamplingError(f"server {addr} answered {r.status}: {text[:300]}")
        out = await asyncio.to_thread(_loads, text)
        meta = out.get("meta_info") or {}
        if sess.adapter is None and sess.model_id is not None:
            got = str(meta.get("weight_version"))
            if got != str(sess.version):
                raise VersionGone(
                    f"the servers hold weight version {got}, not {sess.version} that this "
                    "sampling client was created for (full-weight training replaces the "
                    "servers' weights: create a new sampling client)")
        return out

    async def sample(self, sess: SamplingSession, prompt: list[int], num_samples: int,
                     params: dict[str, Any], prompt_logprobs: bool
                     ) -> tuple[list[Sequence], list[float] | None]:
        """``num_samples`` sequences (their tokens and log-probs) and, when asked, the prompt's
        log-probs (``nan`` at position 0, which nothing predicts)."""
        sp = sampling_params(params)

        async def one(i: int) -> dict[str, Any]:
            body = {"input_ids": prompt, "sampling_params": dict(sp), "return_logprob": True,
                    "logprob_start_len": 0 if (prompt_logprobs and i == 0) else -1,
                    "stream": False, "rid": uuid.uuid4().hex}
            return await self._generate(sess, body)

        answers = await asyncio.gather(*(one(i) for i in range(num_samples)))
        seqs = []
        for a in answers:
            meta = a.get("meta_info") or {}
            entries = meta.get("output_token_logprobs") or []
            finish = meta.get("finish_reason") or {}
            seqs.append(Sequence(tokens=[int(e[1]) for e in entries],
                                 logprobs=[float(e[0]) for e in entries],
                                 stop=finish.get("type") == "stop"))
        plp = None
        if prompt_logprobs:
            entries = (answers[0].get("meta_info") or {}).get("input_token_logprobs") or []
            plp = [float("nan") if e[0] is None else float(e[0]) for e in entries]
            plp = [float("nan")] * (len(prompt) - len(plp)) + plp
            plp[0] = float("nan")
        return seqs, plp


def _loads(text: str) -> dict[str, Any]:
    import json

    return json.loads(text)

"""The reward-model client: ``RemoteInferenceEngine`` over a pool of servers that score
(``python -m servers.launch_server --is-embedding`` or ``sglang.launch_server --is-embedding``).

Nothing of the client is copied: routing, health probes and re-admission, failover and retries,
timeouts and api keys are the generation client's own; only the wire format differs, and that
is a ``GenerateProtocol`` (``SGLANG_SCORE``) posting SGLang's ``EmbeddingReqInput`` to
``/classify`` and reading ``embedding`` (the head's outputs at the last token) into
``Segment.scores``. ``ascore_batch`` (the ``RewardModelScorer`` API that workflows use) runs the
requests on this engine's own event loop, so a workflow awaiting scores leaves its loop free for
the episodes that are still generating; each sequence is one request, and the servers batch
concurrent requests into shared forwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.io_struct import ModelRequest, VersionClock
from arealite.api.reward_model_api import RM_ADDRS_ENV, RewardModelScorer
from arealite.backends.base import GenerateProtocol, ProtocolError, Segment
from arealite.backends.sglang import SGLangProtocol
from arealite.rollout.remote_engine import RemoteInferenceEngine
from arealite.utils.network import parse_addrs
from arealite.weights.fanout import get_info


def encode_score_body(
    input_ids: list[int], g: GenerationHyperparameters, max_new_tokens: int, rid: str,
    generated: int = 0, ids_json: bytes | None = None, lora: str | None = None,
) -> bytes:
    """SGLang's ``EmbeddingReqInput`` for one sequence (sampling settings do not apply; the
    client's LoRA adapter, the policy's, is never the reward model's)."""
    if lora is not None:
        raise ValueError("a reward-model pool scores with its own weights: no LoRA adapter")
    ids = ids_json if ids_json is not None else json.dumps(list(input_ids)).encode()
    return b'{"input_ids":' + ids + b',"rid":' + json.dumps(rid).encode() + b"}"


def parse_score_response(body: Any, fallback_version: int) -> Segment:
    """``{"embedding": [...], "meta_info": {...}}`` (or a list of one) -> ``Segment.scores``."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        raise ProtocolError(f"not a /classify response: {str(body)[:300]}")
    emb = body.get("embedding")
    if not isinstance(emb, list) or not emb:
        raise ProtocolError(f"/classify response without an embedding list: {str(body)[:300]}")
    try:
        scores = [float(x) for x in emb]
    except (TypeError, ValueError) as e:  # orjson writes NaN as null
        raise ProtocolError(f"a score is not a number: {e}") from e
    return Segment(finish_type="stop", weight_version=body["meta_info"].get("weight_version"),
                   scores=scores)


class SGLangScoreProtocol(SGLangProtocol):
    """SGLang's reward-model scoring (``/classify``); control calls as SGLang's."""

    name = "sglang-score"
    generate_path = "/classify"
    encode_generate_body = staticmethod(encode_score_body)
    parse_generate_response = staticmethod(parse_score_response)
    required_endpoints = (("POST", "/classify"),)


SGLANG_SCORE = SGLangScoreProtocol()
_SCORE_G = GenerationHyperparameters(max_new_tokens=0)


class NotAScoringServer(ValueError):
    """A server of the reward-model pool serves a generation model."""


class RemoteRewardModelEngine(RemoteInferenceEngine, RewardModelScorer):
    def __init__(self, config: InferenceEngineConfig, clock: VersionClock | None = None,
                 protocol: GenerateProtocol = SGLANG_SCORE):
        super().__init__(config, clock, protocol)

    def initialize(self, addr: str | list[str] | None = None,
                   train_data_parallel_size: int | None = None) -> None:
        """As the generation client, then each server must report ``is_generation: false``.
        The addresses come from ``addr``, ``server_addrs`` or ``AREAL_RM_SERVER_ADDRS`` (the
        launcher's reward-model pool); never ``AREAL_LLM_SERVER_ADDRS``, the generation pool."""
        addr = addr or self.config.server_addrs or parse_addrs(os.environ.get(RM_ADDRS_ENV), RM_ADDRS_ENV)
        if not addr:
            raise ValueError("reward-model client: no server addresses; set "
                             "reward_model.server_addrs to the --is-embedding servers, or "
                             f"launcher.reward_model_servers (which sets {RM_ADDRS_ENV})")
        super().initialize(addr, train_data_parallel_size)
        try:
            self.loop.run(self._check_scoring()).result(self.config.setup_timeout + 10)
        except BaseException:
            self.destroy()
            raise

    async def _check_scoring(self) -> None:
        session = self._sessions.get()
        for a in self.addresses:
            info = await get_info(session, a, self.protocol.version_info, self.config.setup_timeout)
            if info.get("is_generation") is not False:
                raise NotAScoringServer(
                    f"reward-model server {a} serves a generation model ({info.get('model_path')}): "
                    "start it with --is-embedding on a sequence-classification checkpoint")

    async def ascore(self, input_ids: list[int], rid: str | None = None) -> list[float]:
        """The head outputs for one sequence (a reward model: one score)."""
        req = ModelRequest(rid=rid or uuid.uuid4().hex, input_ids=list(input_ids),
                           gconfig=_SCORE_G)
        resp = await asyncio.wrap_future(self.loop.run(self.agenerate(req)))
        if not resp.scores:
            raise ProtocolError(f"request {req.rid}: the server returned no score")
        return resp.scores

    async def ascore_batch(self, sequences: list[list[int]]) -> list[float]:
        outs = await asyncio.gather(*(self.ascore(s) for s in sequences))
        return [o[0] for o in outs]

"""``POST /classify`` and ``POST /encode``: scoring with a reward model, as SGLang serves one.

SGLang (``sglang.launch_server --is-embedding``) takes an ``EmbeddingReqInput`` on both routes
(``text`` or ``input_ids``, single or batch, ``rid``) and answers, per input,
``{"embedding": [head outputs], "meta_info": {"id", "finish_reason", "prompt_tokens",
"weight_version", ...}}`` (a list for a batch); a reward model's ``embedding`` is its
``num_labels`` scores at the sequence's last token. Errors are 400 ``{"error": {"message"}}``
(SGLang's ``_create_error_response``), raised before anything runs, so a bad request never
touches another: every request is checked on its own, then waits in the ``ScoreBatcher``.

``ScoreBatcher`` is the server-side batching: requests that arrive while a forward runs wait,
and the next forward takes all of them (up to ``--max-prefill-tokens`` padded tokens), so
concurrent single-sample requests from many clients share forwards as SGLang's scheduler
batches them. The forwards run in the engine thread, which owns the model. While the server's
memory is released (``/release_memory_occupation``: a co-located trainer holds the device),
scoring requests wait and run after the resume, as generation requests queue.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from servers.routes.generate import error_response
from servers.state import ServerState

router = APIRouter()
RELEASED_POLL_S = 0.05  # how often waiting scores look whether the memory is back

NOT_EMBEDDING = ("This model does not appear to be an embedding model by default. Please add "
                 "`--is-embedding` when launching the server or try another model.")


class EmbeddingReqInput(BaseModel):
    """The fields of SGLang's ``EmbeddingReqInput`` the embedded server reads (others ignored)."""

    model_config = ConfigDict(extra="ignore")
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    rid: str | list[str] | None = None


def _prompts(state: ServerState, obj: EmbeddingReqInput) -> tuple[list[list[int]], bool]:
    """Token lists and whether the request is single; ``ValueError`` names what is wrong."""
    if obj.text is None and obj.input_ids is None:
        raise ValueError("At least one of text, input_ids, image, video, or audio should be "
                         "provided")
    if obj.text is not None and obj.input_ids is not None:
        raise ValueError("text and input_ids cannot be provided at the same time")
    runner = state.runner
    if obj.text is not None:
        single = isinstance(obj.text, str)
        if runner.tokenizer is None:
            raise ValueError("text input needs a tokenizer; the server runs with "
                             "--skip-tokenizer-init")
        texts = [obj.text] if single else obj.text
        prompts = [runner.tokenizer.encode(t, add_special_tokens=True) for t in texts]
    else:
        ids = obj.input_ids
        if not ids:
            raise ValueError("input_ids cannot be empty.")
        single = isinstance(ids[0], int)
        prompts = [ids] if single else list(ids)
    if not prompts:
        raise ValueError("The batch is empty.")
    ctx, vocab = runner.context_len, runner.vocab_size
    for i, p in enumerate(prompts):
        where = "" if single else f" (item {i})"
        if not p:
            raise ValueError(f"input_ids cannot be empty{where}.")
        if any(t < 0 or t >= vocab for t in p):
            raise ValueError(f"Token ids must be in [0, {vocab - 1}]{where}.")
        if len(p) > ctx:
            raise ValueError(f"The input ({len(p)} tokens){where} is longer than the model's "
                             f"context length ({ctx} tokens).")
    return prompts, single


def _rids(obj: EmbeddingReqInput, n: int, single: bool) -> list[str]:
    import uuid

    if obj.rid is None:
        return [uuid.uuid4().hex for _ in range(n)]
    if isinstance(obj.rid, str):
        return [obj.rid] if single else [f"{obj.rid}_{i}" for i in range(n)]
    if len(obj.rid) != n:
        raise ValueError(f"The rid list holds {len(obj.rid)} ids for {n} inputs.")
    if len(set(obj.rid)) != n:
        raise ValueError("Duplicate request IDs detected within the request.")
    return list(obj.rid)


class ScoreBatcher:
    """Pending prompts of all requests; one drain task scores them in engine-thread forwards."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.pending: list[tuple[list[list[int]], asyncio.Future]] = []
        self.task: asyncio.Task | None = None
        self.forwards = 0  # how many forwards ran (batching shows as forwards < requests)

    async def score(self, prompts: list[list[int]]) -> list[list[float]]:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((prompts, fut))
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._drain())
        return await fut

    def _take(self) -> list[tuple[list[list[int]], asyncio.Future]]:
        """Requests for the next forwards: at least one, then while the padded size fits."""
        budget = self.state.args.max_prefill_tokens
        first = self.pending.pop(0)
        taken, longest, rows = [first], max(len(p) for p in first[0]), len(first[0])
        while self.pending:
            prompts = self.pending[0][0]
            L = max(longest, *(len(p) for p in prompts))
            if L * (rows + len(prompts)) > budget:
                break
            taken.append(self.pending.pop(0))
            longest, rows = L, rows + len(prompts)
        return taken

    def _chunks(self, flat: list[list[int]]) -> list[list[list[int]]]:
        """``flat`` in order, cut so each forward's padded size fits the budget (one request
        larger than the budget runs as several forwards)."""
        budget, out, cur, longest = self.state.args.max_prefill_tokens, [], [], 0
        for p in flat:
            L = max(longest, len(p))
            if cur and L * (len(cur) + 1) > budget:
                out.append(cur)
                cur, L = [], len(p)
            cur.append(p)
            longest = L
        return out + [cur] if cur else out

    async def _drain(self) -> None:
        runner, engine = self.state.runner, self.state.engine
        while self.pending:
            taken = [(p, f) for p, f in self._take() if not f.done()]  # skip cancelled callers
            flat = [p for prompts, _ in taken for p in prompts]
            scores: list[list[float]] = []
            try:
                for chunk in self._chunks(flat):
                    # checked in the engine thread, where releases run: none slips in between
                    while (out := await self.state.in_engine(
                            lambda c=chunk: None if engine.memory_released else runner.score(c))
                           ) is None:
                        await asyncio.sleep(RELEASED_POLL_S)
                    scores += out
                    self.forwards += 1
            except Exception as e:  # noqa: BLE001 - handed to each waiting request
                for _, f in taken:
                    if not f.done():
                        f.set_exception(e)
                continue
            i = 0
            for prompts, f in taken:
                if not f.done():
                    f.set_result(scores[i: i + len(prompts)])
                i += len(prompts)


def batcher(state: ServerState) -> ScoreBatcher:
    b = getattr(state, "score_batcher", None)
    if b is None:
        b = state.score_batcher = ScoreBatcher(state)
    return b


def batcher_stats(state: ServerState) -> dict[str, int]:
    """``/server_info`` of a reward-model server: forwards run for /classify and /encode."""
    b = getattr(state, "score_batcher", None)
    return {} if b is None else {"score_forwards": b.forwards}


async def _score_request(obj: EmbeddingReqInput, request: Request) -> Response:
    state: ServerState = request.app.state.server
    if state.runner.is_generation:
        return error_response(NOT_EMBEDDING)
    try:
        prompts, single = _prompts(state, obj)
        rids = _rids(obj, len(prompts), single)
    except ValueError as e:
        return error_response(str(e))
    await state.wait_unpaused()
    async with state.lock.reader():
        scores = await batcher(state).score(prompts)
    version = state.engine.weight_version
    outs: list[dict[str, Any]] = [
        {"embedding": s, "meta_info": {
            "id": rid, "finish_reason": {"type": "length", "length": 0},
            "prompt_tokens": len(p), "weight_version": version, "num_retractions": 0}}
        for s, p, rid in zip(scores, prompts, rids)
    ]
    return JSONResponse(outs[0] if single else outs)


@router.api_route("/classify", methods=["POST", "PUT"])
async def classify(obj: EmbeddingReqInput, request: Request) -> Response:
    """Score with a reward model (SGLang: the same arguments and answers as ``/encode``)."""
    return await _score_request(obj, request)


@router.api_route("/encode", methods=["POST", "PUT"])
async def encode(obj: EmbeddingReqInput, request: Request) -> Response:
    return await _score_request(obj, request)

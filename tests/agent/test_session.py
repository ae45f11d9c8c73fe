"""A session's rows carry a MoE server's routed experts: each turn adds the rows past the
earlier turns' (no server needed: the engine answers with scripted tokens)."""

from __future__ import annotations

import asyncio

import numpy as np

from arealite.agent.proxy import AgentProxy
from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.io_struct import ModelResponse


class RoutedEngine:
    """Answers each call with ``reply`` and routed experts holding the call's index."""

    def __init__(self, reply: list[int]) -> None:
        self.reply, self.calls = reply, []

    async def agenerate(self, req):
        self.calls.append(req)
        rows = len(req.input_ids) + len(self.reply) - 1
        resp = ModelResponse(
            list(req.input_ids),
            list(self.reply),
            [-0.5] * len(self.reply),
            [0] * len(self.reply),
            "stop",
        )
        resp.routed_experts = np.full((rows, 4), len(self.calls) - 1, dtype=np.int32)
        return resp


def test_turns_join_their_routed_experts_into_the_segment_row(tiny_tokenizer):
    tok = tiny_tokenizer
    eng = RoutedEngine(tok("7<|im_end|>", add_special_tokens=False)["input_ids"])
    proxy = AgentProxy(eng, tok, GenerationHyperparameters(max_new_tokens=8))
    session = proxy.start_session()
    msgs = [{"role": "user", "content": "What is 3 + 4?"}]
    out = asyncio.run(proxy.chat(session, {"messages": msgs}))
    msgs += [out["choices"][0]["message"], {"role": "user", "content": "And 2 + 2?"}]
    asyncio.run(proxy.chat(session, {"messages": msgs}))
    assert [s.turns for s in session.segments] == [[0, 1]]
    row = session.rows()[0]
    n = len(row["input_ids"])
    first = len(eng.calls[0].input_ids) + len(eng.reply) - 1
    assert row["routed_experts"].shape == (n, 4)
    assert row["routed_experts"][:, 0].tolist() == [0] * first + [1] * (n - 1 - first) + [-1]

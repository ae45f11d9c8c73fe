"""Agents for the tests, named by import path as a user's would be."""

from __future__ import annotations

import asyncio
import json

from tests.support.tool_model import CONVERSATION, TOOLS


async def calculator(client, data) -> float:
    """Answer with the calculator tool; reward 1 when the final answer is ``data['answer']``."""
    msgs = [{"role": "user", "content": data.get("question", CONVERSATION[0]["content"])}]
    for _ in range(4):
        r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        msgs.append(m.model_dump(exclude_none=True))
        if not m.tool_calls:
            return float((m.content or "").strip() == str(data.get("answer", "89")))
        for call in m.tool_calls:
            expr = json.loads(call.function.arguments)["expr"]
            msgs.append({"role": "tool", "tool_call_id": call.id, "content": str(eval(expr))})
    return 0.0


async def raises(client, data):
    await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}],
                                         max_tokens=2)
    raise KeyError("no such tool")


async def never_ends(client, data):
    await asyncio.sleep(3600)


async def returns_garbage(client, data):
    await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}],
                                         max_tokens=2)
    return "great"


async def no_calls(client, data):
    return 1.0


async def rewards_each_turn(client, data):
    """Sets a reward per turn through the proxy's HTTP reward route; returns None."""
    msgs = [{"role": "user", "content": "x"}]
    for k in range(2):
        r = await client.chat.completions.create(model="p", messages=msgs, max_tokens=3)
        await client.post("../reward", body={"reward": float(k + 1), "turn": r.id}, cast_to=object)
        msgs += [r.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "again"}]
    return None


def not_async(client, data):
    return 1.0

"""The calculator agent of docs/agents.md: plain OpenAI-client code, nothing of arealite's
training API. It asks the model, runs every ``calc`` call the model makes, feeds the result
back, and scores the final answer. AgentWorkflow hands it a client bound to one proxy session.
"""

from __future__ import annotations

import json

from arealite.demo.toy_tools import TOOLS, calculate

MAX_ROUNDS = 3


async def run(client, data: dict) -> float:
    messages = [{"role": "user", "content": data["question"]}]
    for _ in range(MAX_ROUNDS):
        reply = await client.chat.completions.create(model="policy", messages=messages,
                                                     tools=TOOLS)
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return float((msg.content or "").strip() == data["answer"])
        for call in msg.tool_calls:
            try:
                result = calculate(json.loads(call.function.arguments).get("expr"))
            except (json.JSONDecodeError, AttributeError):
                result = "error: arguments must be a JSON object with expr"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0

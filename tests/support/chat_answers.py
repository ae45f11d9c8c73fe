"""A chat-completions answer as the proxy's chat route returns it, for the tests of the API
translations built on that route (Responses, Messages)."""

from __future__ import annotations

from typing import Any


def chat_answer(
    content: str | None, calls: tuple | list = (), reason: str = "stop"
) -> dict[str, Any]:
    """One choice with ``content`` and a ``calc`` tool call per JSON string in ``calls``."""
    return {
        "id": "chatcmpl-abc",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": reason,
                "logprobs": None,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [
                        {
                            "id": f"call_{i}",
                            "type": "function",
                            "function": {"name": "calc", "arguments": a},
                        }
                        for i, a in enumerate(calls)
                    ]
                    or None,
                },
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }

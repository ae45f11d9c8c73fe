"""A tiny model taught (a few hundred teacher-forced steps, seconds on CPU) to replay fixed
tool-calling conversations, so tests see real generated tool calls from a real model."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

TOOLS = [{"type": "function", "function": {
    "name": "calc", "description": "evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}},
                   "required": ["expr"]}}}]


def call(expr: str, cid: str = "c") -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": "calc", "arguments": {"expr": expr}}}]}


# question -> two tool rounds -> answer: three assistant turns, each after a tool result
CONVERSATION = [
    {"role": "user", "content": "What is 12*7+5?"},
    call("12*7", "c1"),
    {"role": "tool", "tool_call_id": "c1", "content": "84"},
    call("84+5", "c2"),
    {"role": "tool", "tool_call_id": "c2", "content": "89"},
    {"role": "assistant", "content": "89"},
]


def think_template() -> str:
    """The tiny chat template made Qwen3-like: an assistant reply that comes before the last user
    turn loses its ``<think>...</think>`` reasoning, so the template is not append-only."""
    from arealite.demo.tiny_tokenizer import CHAT_TEMPLATE

    plain = ("{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + "
             "'<|im_end|>' + '\n' }}")
    assert plain in CHAT_TEMPLATE
    dropped = ("{% set c = message['content'] or '' %}"
               "{% if message['role'] == 'assistant' and loop.index0 < ns.last_user "
               "and '</think>' in c %}{% set c = c.split('</think>')[-1].lstrip('\n') %}{% endif %}"
               "{{ '<|im_start|>' + message['role'] + '\n' + c + '<|im_end|>' + '\n' }}")
    head = ("{% set ns = namespace(last_user=-1) %}{% for m in messages %}"
            "{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}"
            "{% endfor %}")
    return head + CHAT_TEMPLATE.replace(plain, dropped)


# a reply with reasoning, then a follow-up question: the think template drops the reasoning
THINK_CONVERSATION = [
    {"role": "user", "content": "Think: 2+3?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n5"},
]


def teach(src: Path, dst: Path, conversations: list[list[dict]], steps: int = 300,
          lr: float = 3e-3, templates: list[str | None] | None = None) -> Path:
    """Copy the model at ``src`` to ``dst`` and train it on the assistant turns of
    ``conversations`` (rendered with ``TOOLS``, and each with its template from ``templates``
    when given) until greedy decoding replays them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(src, dst, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(dst))
    rows = []
    for conv, template in zip(conversations, templates or [None] * len(conversations)):
        for k, m in enumerate(conv):
            if m["role"] != "assistant":
                continue
            head = tok.apply_chat_template(conv[:k], tools=TOOLS, add_generation_prompt=True,
                                           tokenize=False, chat_template=template)
            full = tok.apply_chat_template(conv[:k + 1], tools=TOOLS, tokenize=False,
                                           chat_template=template)
            h, f = tok.encode(head, add_special_tokens=False), tok.encode(full, add_special_tokens=False)
            f = f[:len(f) - 1] if tok.decode(f[-1:]) == "\n" else f  # ends at <|im_end|>
            ids, mask = f, [0] * len(h) + [1] * (len(f) - len(h))
            rows.append((ids, mask))
    model = AutoModelForCausalLM.from_pretrained(str(dst), dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        worst = 0.0
        for ids, mask in rows:
            x = torch.tensor([ids])
            labels = torch.tensor([[t if m else -100 for t, m in zip(ids, mask)]])
            loss = model(input_ids=x, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            worst = max(worst, loss.item())
        if worst < 1e-3:
            break
    model.save_pretrained(str(dst), safe_serialization=True)
    return dst

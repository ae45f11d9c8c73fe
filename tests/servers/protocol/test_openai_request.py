"""OpenAI request parsing: SGLang's and OpenAI's defaults and message normalisation."""

from __future__ import annotations

import copy

import pytest

from servers.protocol.openai_request import (
    COMPLETION_MAX_TOKENS,
    choice_seed,
    normalize_messages,
    parse_chat,
    parse_completion,
    render_chat,
)

# SmolLM2-Instruct's template: it concatenates the content, so a None content fails in jinja
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_completions_default_to_16_tokens_chat_to_the_context(tiny_tokenizer):
    V = tiny_tokenizer.vocab_size
    assert parse_completion({"prompt": "hi"}, tiny_tokenizer, V).params["max_new_tokens"] == 16
    assert COMPLETION_MAX_TOKENS == 16
    assert (
        parse_completion({"prompt": "hi", "max_tokens": 3}, tiny_tokenizer, V).params[
            "max_new_tokens"
        ]
        == 3
    )
    chat = parse_chat({"messages": [{"role": "user", "content": "hi"}]}, tiny_tokenizer, V)
    assert chat.params["max_new_tokens"] is None


def test_assistant_content_null_reaches_the_template_as_empty(tiny_tokenizer):
    msgs = [
        {"role": "user", "content": "2+2?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "4"},
        {"role": "assistant", "content": None},
    ]
    out = normalize_messages(msgs)
    assert out[1]["content"] == "" and out[3]["content"] == ""
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = SMOLLM2_TEMPLATE
    ids = render_chat(tok, out, None)  # a None content would raise in the template
    assert "<|im_start|>assistant\n<|im_end|>" in tok.decode(ids)
    with pytest.raises(ValueError, match="content is required"):
        normalize_messages([{"role": "user", "content": None}])


def test_choice_seeds_differ_per_choice_and_repeat():
    seeds = [choice_seed(7, j) for j in range(64)]
    assert seeds[0] == 7 and len(set(seeds)) == 64
    assert seeds == [choice_seed(7, j) for j in range(64)]
    assert all(-(2**63) <= s < 2**63 for s in seeds)
    assert choice_seed(-(2**63), 5) != choice_seed(2**63 - 1, 5)

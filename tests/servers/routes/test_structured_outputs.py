"""Structured outputs (xgrammar): /generate's json_schema / regex / ebnf, OpenAI's
response_format and forced tool calls, each output checked against its constraint."""

from __future__ import annotations

import json
import math
import re

import pytest

from tests.support.http_calls import gen, post
from tests.support.tool_model import CONVERSATION, TOOLS

pytest.importorskip("xgrammar")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytestmark = pytest.mark.integration

# bounded (a number of two digits at most, compact JSON on the tool server), so a 60-token
# budget always fits a complete value whatever the tiny model prefers
SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"type": "string", "enum": ["a", "bc"]},
    },
    "required": ["n", "tag"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{2}-(yes|no)"
EBNF = 'root ::= "(" item ("," item)? ")"\nitem ::= "x" | "yy"'


@pytest.fixture(scope="module")
def base(tool_server):
    return f"http://{tool_server}"


def test_generate_constraints_hold_in_a_mixed_batch(base):
    """One call: 3 constrained kinds x 3 samples and unconstrained rows in the same batch."""
    free = {"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True}
    kinds = [{"json_schema": json.dumps(SCHEMA)}, {"regex": REGEX}, {"ebnf": EBNF}]
    sps = [{"max_new_tokens": 60, "temperature": 1.0, **k} for k in kinds for _ in range(3)]
    sps += [free] * 3
    outs = gen(base, {"input_ids": [[5, 6, 7]] * len(sps), "sampling_params": sps})
    for o in outs[0:3]:
        jsonschema.validate(json.loads(o["text"]), SCHEMA)
    for o in outs[3:6]:
        assert re.fullmatch(REGEX, o["text"]), o["text"]
    for o in outs[6:9]:
        assert re.fullmatch(r"\((x|yy)(,(x|yy))?\)", o["text"]), o["text"]
    for o in outs[:9]:
        assert o["meta_info"]["finish_reason"]["type"] == "stop"
    assert all(o["meta_info"]["completion_tokens"] == 12 for o in outs[9:])


def test_bad_grammars_are_a_400(base):
    for sp, frag in (
        ({"regex": "[0-9"}, "Failed to compile regex"),
        ({"json_schema": "{nope"}, "Failed to compile json_schema"),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "Only one of"),
    ):
        r = post(base, "/generate", {"input_ids": [5], "sampling_params": sp})
        assert r.status_code == 400 and frag in r.json()["error"]["message"], r.text
    assert gen(base, {"input_ids": [5], "sampling_params": {"max_new_tokens": 2}})["output_ids"]


def test_constrained_logprobs_are_of_the_masked_distribution(base, tiny_tokenizer):
    """SGLang's convention: log_softmax over the masked logits (renormalised over allowed)."""
    prompt = [5, 6, 7]
    c = gen(
        base,
        {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 1, "temperature": 1.0, "regex": "[0-9]"},
        },
    )
    lp, tok = c["meta_info"]["output_token_logprobs"][0][:2]
    vocab = len(tiny_tokenizer)  # the tool model keeps the tiny model's tokenizer
    full = gen(
        base,
        {
            "input_ids": prompt,
            "return_logprob": True,
            "top_logprobs_num": vocab,
            "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
        },
    )
    row = {i: v for v, i, _ in full["meta_info"]["output_top_logprobs"][0]}
    digits = [i for i in row if re.fullmatch("[0-9]", tiny_tokenizer.decode([i]))]
    assert tok in digits
    norm = math.log(sum(math.exp(row[i]) for i in digits))
    assert lp == pytest.approx(row[tok] - norm, abs=1e-4)


@pytest.fixture(scope="module")
def client(tool_server):
    return openai.OpenAI(
        base_url=f"http://{tool_server}/v1", api_key="unused", max_retries=0, timeout=120
    )


def test_response_format_json_schema_and_object(client):
    msgs = [{"role": "user", "content": "Give me a number."}]
    for n in range(2):
        r = client.chat.completions.create(
            model="m",
            messages=msgs,
            max_tokens=80,
            temperature=1.0,
            seed=n,
            n=2,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
            },
        )
        for ch in r.choices:
            jsonschema.validate(json.loads(ch.message.content), SCHEMA)
    # json_object bounds no string, so a sampled reply may run out of tokens mid-string (a
    # truncated object, finish_reason "length", as OpenAI's); greedy closes its object in 80
    obj = client.chat.completions.create(
        model="m", messages=msgs, max_tokens=80, temperature=0,
        response_format={"type": "json_object"},
    )
    assert obj.choices[0].finish_reason == "stop", obj.choices[0].message.content
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    done = client.completions.create(
        model="m", prompt="x", max_tokens=40, temperature=1.0, extra_body={"regex": REGEX}
    )
    assert re.fullmatch(REGEX, done.choices[0].text)


def test_tool_choice_required_and_named_force_a_call(client):
    # after the last tool result the model answers in text; a forced choice makes it call calc
    msgs = [CONVERSATION[0], *CONVERSATION[1:5]]
    auto = client.chat.completions.create(
        model="m", messages=msgs, tools=TOOLS, max_tokens=60, temperature=0
    )
    assert auto.choices[0].message.tool_calls is None
    for choice in ("required", {"type": "function", "function": {"name": "calc"}}):
        r = client.chat.completions.create(
            model="m", messages=msgs, tools=TOOLS, max_tokens=120, temperature=0, tool_choice=choice
        )
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and calls[0].function.name == "calc"
        assert isinstance(json.loads(calls[0].function.arguments)["expr"], str)
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(
            model="m",
            messages=msgs,
            tools=TOOLS,
            max_tokens=4,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )

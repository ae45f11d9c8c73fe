"""Request parsing: the contract gate (checked against SGLang's own decoder), normalisation,
sampling-parameter validation, weight-version spans and the auth rules."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servers.engine.sequence import weight_version_spans
from servers.protocol.auth import allowed
from servers.protocol.contract import ContractError, check_generate_body
from servers.protocol.request import TOP_K_ALL, SamplingParams, normalize_generate

V = 100

json_scalars = st.none() | st.booleans() | st.integers(-5, 300) | st.floats(-3, 3) | st.text(max_size=4)
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=3)
                           | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8)
sp_keys = st.sampled_from(["max_new_tokens", "temperature", "top_p", "top_k", "stop", "n",
                           "stop_token_ids", "ignore_eos", "logit_bias", "min_p", "bogus"])
bodies = st.fixed_dictionaries({}, optional={
    "input_ids": json_values | st.lists(st.integers(0, 99), max_size=4),
    "text": json_values,
    "rid": json_values,
    "stream": json_values,
    "return_logprob": json_values,
    "logprob_start_len": json_values,
    "sampling_params": st.dictionaries(sp_keys, json_values, max_size=4) | json_values,
    "unknown_top_level": json_values,
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies)
def test_contract_gate_agrees_with_sglang(api_types, body):
    """Our gate rejects exactly what SGLang's generated decoder rejects, with the same text."""
    try:
        api_types.GenerateRequest.from_json_value(body)
        theirs = None
    except api_types.JsonContractError as e:
        theirs = str(e)
    try:
        check_generate_body(body)
        ours = None
    except ContractError as e:
        ours = str(e)
    assert ours == theirs


def test_contract_unknown_sampling_key_text():
    with pytest.raises(ContractError, match=r"unknown field `logprobs`, expected one of `max_new_tokens`"):
        check_generate_body({"input_ids": [1], "sampling_params": {"logprobs": 1}})
    check_generate_body({"input_ids": [1], "whatever": 1})  # top-level unknowns are ignored


def test_sampling_defaults_and_greedy_folding():
    p = SamplingParams.from_dict({}, V)
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.n) == (128, 1.0, 1.0, TOP_K_ALL, 0.0, 1)
    g = SamplingParams.from_dict({"temperature": 0}, V)
    assert (g.temperature, g.top_k, g.greedy) == (1.0, 1, True)
    assert SamplingParams.from_dict({"top_k": -1, "max_new_tokens": None}, V).top_k == TOP_K_ALL
    assert SamplingParams.from_dict({"stop": "x", "stop_token_ids": [3, 3]}, V).stop == ["x"]


@pytest.mark.parametrize("sp,msg", [
    ({"temperature": -1}, "temperature must be a non-negative finite number"),
    ({"top_p": 0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"min_p": 2}, r"min_p must be in \[0, 1\]"),
    ({"top_k": 0}, "top_k must be -1"),
    ({"max_new_tokens": -3}, "max_new_tokens must be at least 0"),
    ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens must be in"),
    ({"repetition_penalty": 0}, "repetition_penalty must be in"),
    ({"frequency_penalty": 3}, "frequency_penalty must be in"),
    ({"logit_bias": {"100000": 1.0}}, "logit_bias must has keys"),
    ({"structural_tag": "{}"}, "not supported"),
    ({"regex": "a+", "json_schema": "{}"}, "Only one of json_schema"),
    ({"stop": ["s"] * 33}, "at most 32 stop strings"),
])
def test_sampling_validation_messages(sp, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams.from_dict(sp, V)


def test_normalize_single_batch_and_n():
    one = normalize_generate({"input_ids": [1, 2], "rid": "r"}, V)
    assert one.is_single and [i.rid for i in one.items] == ["r"]
    batch = normalize_generate({"input_ids": [[1], [2, 3]], "rid": "r"}, V)
    assert not batch.is_single and [i.rid for i in batch.items] == ["r_0", "r_1"]
    n = normalize_generate({"input_ids": [[1], [2]], "rid": "r", "sampling_params": {"n": 3}}, V)
    assert not n.is_single and len(n.items) == 6
    assert [i.input_ids for i in n.items] == [[1]] * 3 + [[2]] * 3  # prompt-major
    assert len({i.rid for i in n.items}) == 6 and "r_0" not in {i.rid for i in n.items}
    single_n = normalize_generate({"input_ids": [1], "sampling_params": {"n": 2}}, V)
    assert not single_n.is_single and len(single_n.items) == 2
    lp = normalize_generate({"input_ids": [[1], [2]], "return_logprob": [True, False]}, V)
    assert [i.return_logprob for i in lp.items] == [True, False]


@pytest.mark.parametrize("body,msg", [
    ({}, "Either text, input_ids or input_embeds should be provided."),
    ({"input_ids": []}, "input_ids cannot be empty."),
    ({"input_ids": [[1], []]}, "input_ids cannot be empty."),
    ({"input_ids": [1, 100]}, "Token ids must be in"),
    ({"input_ids": [[1], [2]], "rid": ["a", "a"]}, "Duplicate request IDs"),
    ({"input_ids": [[1], [2]], "rid": ["a"]}, "rids length mismatch"),
    ({"input_ids": [[1], [2]], "sampling_params": [{"n": 2}, {"n": 1}]}, "parallel_sample_num"),
    ({"input_ids": [[1], [2]], "sampling_params": {"n": 2}, "return_logprob": [True, True]},
     "not supported with n > 1"),
    ({"input_ids": [1], "sampling_params": {"n": 10**6}}, "at most 4096 sequences"),
    ({"text": ["a", "b"], "input_ids": [[1]]}, "input_ids hold 1 prompts but text holds 2"),
])
def test_normalize_errors(body, msg):
    with pytest.raises(ValueError, match=msg):
        normalize_generate(body, V)


def test_weight_version_spans():
    assert weight_version_spans([], "v0", 5) == [{"version": "v0", "start": 0, "end": 5}]
    assert weight_version_spans([("v0", 3)], "v1", 8) == [
        {"version": "v0", "start": 0, "end": 3}, {"version": "v1", "start": 3, "end": 8}]
    # a change with no new tokens in between merges away; same version twice merges
    assert weight_version_spans([("v0", 3), ("v1", 3)], "v2", 4) == [
        {"version": "v0", "start": 0, "end": 3}, {"version": "v2", "start": 3, "end": 4}]
    assert weight_version_spans([("v0", 2)], "v0", 4) == [{"version": "v0", "start": 0, "end": 4}]
    assert weight_version_spans([], "v3", 0) == [{"version": "v3", "start": 0, "end": 0}]


def test_auth_rules():
    ok = lambda path, hdr, key=None, admin=None: allowed("POST", path, hdr, key, admin)  # noqa: E731
    assert ok("/generate", None) and ok("/pause_generation", None)
    assert not ok("/generate", None, key="k") and ok("/generate", "Bearer k", key="k")
    assert ok("/health", None, key="k", admin="a") and ok("/metrics", None, key="k")
    assert ok("/pause_generation", "Bearer k", key="k")
    assert not ok("/pause_generation", "Bearer k", key="k", admin="a")
    assert ok("/pause_generation", "Bearer a", key="k", admin="a")
    assert not ok("/generate", "Bearer a", key="k", admin="a")
    assert not ok("/generate", "Basic k", key="k")

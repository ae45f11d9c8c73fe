"""OpenAI request bodies (``/v1/completions``, ``/v1/chat/completions``) -> prompts and SGLang
sampling parameters, with SGLang's field mapping and a ``ValueError`` (a 400) for anything bad.

Field mapping as SGLang's ``ChatCompletionRequest.to_sampling_params``: ``max_completion_tokens``
wins over ``max_tokens`` (absent: up to the context on chat, 16 on completions, SGLang's and
OpenAI's ``CompletionRequest`` default), ``seed`` is ``sampling_seed`` (choice ``j`` of ``n``
samples with ``choice_seed(seed, j)``, so the choices differ and a rerun repeats them),
``min_tokens`` is ``min_new_tokens``; SGLang's extras (``top_k``, ``min_p``,
``repetition_penalty``, ``stop_token_ids``, ``ignore_eos``, ``skip_special_tokens``,
``no_stop_trim``) pass through. Chat messages go through the tokenizer's chat template with
``tools`` (dropped when ``tool_choice`` is ``"none"``), assistant ``tool_calls`` arguments parsed
from their JSON string as SGLang does before templating.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from servers.protocol.request import SamplingParams

COMPLETION_MAX_TOKENS = 16  # OpenAI's and SGLang's CompletionRequest.max_tokens default
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOP_LOGPROBS_CHAT = 20
MAX_LOGPROBS_COMPLETION = 5
_PASS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
         "repetition_penalty", "stop", "stop_token_ids", "n", "ignore_eos", "skip_special_tokens",
         "no_stop_trim", "logit_bias", "regex", "ebnf", "json_schema")


@dataclass
class OpenAIRequest:
    model: str
    prompts: list[list[int]]  # one token list per prompt
    params: dict[str, Any]  # raw SGLang sampling params (one SamplingParams per choice)
    n: int
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    echo: bool = False
    tools: list[dict[str, Any]] | None = None
    prompt_texts: list[str] = field(default_factory=list)
    lora_path: Any = None  # SGLang's extra field: an adapter name, or one per prompt
    # tool_choice "required" or a named function: the tools one call must be made to
    forced_tools: list[dict[str, Any]] | None = None


def _int_field(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
    return v


def choice_seed(seed: int, j: int) -> int:
    """The sampling seed of choice ``j`` of a seeded ``n > 1`` request: choice 0 keeps ``seed``
    (so ``n=1`` repeats it), the others a splitmix64 mix of (seed, j) in the signed 64-bit
    range. OpenAI's ``seed`` gives ``n`` different samples; one seed for all would repeat one."""
    if j == 0:
        return seed
    z = (seed + j * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return z - (1 << 64) if z >= 1 << 63 else z


def _common(body: dict[str, Any], vocab_size: int, default_max_tokens: int | None = None,
            min_max_tokens: int = 1) -> tuple[dict[str, Any], int, bool, bool]:
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError("model must be a string")
    params = {k: body[k] for k in _PASS if body.get(k) is not None}
    mnt = _int_field(body, "max_completion_tokens", min_max_tokens)
    if mnt is None:
        mnt = _int_field(body, "max_tokens", min_max_tokens)
    # None: up to the context (chat), as SGLang's default
    params["max_new_tokens"] = mnt if mnt is not None else default_max_tokens
    min_tokens = _int_field(body, "min_tokens", 0)
    if min_tokens is not None:
        params["min_new_tokens"] = min_tokens
    schema = response_format_schema(body.get("response_format"))
    if schema is not None:
        params["json_schema"] = schema
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        params["sampling_seed"] = seed
    try:
        sp = SamplingParams.from_dict(params, vocab_size)  # SGLang's checks and messages
    except (TypeError, AttributeError) as e:
        raise ValueError(f"invalid sampling parameters: {e}") from None
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ValueError("stream must be a boolean")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ValueError("stream_options must be an object")
    if opts and not stream:
        raise ValueError("stream_options is only allowed when stream is true")
    return params, sp.n, stream, bool(opts.get("include_usage"))


def response_format_schema(rf: Any) -> str | None:
    """SGLang's mapping of ``response_format`` to its ``json_schema`` sampling parameter:
    ``json_object`` is ``{"type": "object"}``, ``json_schema`` its schema, ``text`` nothing."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise ValueError("response_format.type must be 'text', 'json_object' or 'json_schema'")
    if rf["type"] == "json_object":
        return '{"type": "object"}'
    if rf["type"] == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema", spec.get("schema_")) if isinstance(spec, dict) else None
        if schema is None:
            raise ValueError("schema_ is required for json_schema response format request.")
        return schema if isinstance(schema, str) else json.dumps(schema)
    return None


def forced_tools(choice: Any, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The tools a ``tool_choice`` of ``"required"`` or ``{"type": "function", "function":
    {"name": ...}}`` forces one call to (None for ``auto``/``none``/absent)."""
    if choice in (None, "none", "auto"):
        return None
    if not tools:
        raise ValueError("tool_choice 'required' or a named function needs tools")
    if choice == "required":
        return tools
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    named = [t for t in tools if t["function"]["name"] == name]
    if not named:
        raise ValueError(f"tool_choice names function {name!r}, which is not in tools")
    return named


def _text_of(content: Any, where: str) -> str | None:
    """Message content: a string, null, or a list of text parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise ValueError(f"{where}: only text content parts are supported")
            parts.append(p["text"])
        return "".join(parts)
    raise ValueError(f"{where}: content must be a string or a list of text parts")


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Check chat messages and turn them into what a chat template reads."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ValueError(f"{where} must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise ValueError(f"{where}: 'role' must be one of {list(ROLES)}, got {role!r}")
        msg: dict[str, Any] = {"role": role, "content": _text_of(m.get("content"), where)}
        if role == "assistant" and msg["content"] is None:
            msg["content"] = ""  # SGLang hands the template "" (templates concatenate it)
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
            if msg["content"] is None:
                raise ValueError(f"{where}: a tool message needs content")
        calls = m.get("tool_calls")
        if role == "assistant" and calls:
            msg["tool_calls"] = [_parse_call(c, f"{where}.tool_calls[{j}]")
                                 for j, c in enumerate(calls)]
        elif msg["content"] is None:
            raise ValueError(f"{where}: content is required for role {role!r}")
        out.append(msg)
    return out


def _parse_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ValueError(f"{where}: a tool call needs function.name")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: function.arguments is not valid JSON ({e})") from None
    return {"id": call.get("id"), "type": "function",
            "function": {"name": fn["name"], "arguments": args if args is not None else {}}}


def check_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ValueError("tools must be a list")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not (isinstance(t, dict) and t.get("type", "function") == "function"
                and isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
            raise ValueError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
    return tools or None


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: list | None) -> list[int]:
    if tokenizer is None:
        raise ValueError("chat completions need a tokenizer; the server runs with --skip-tokenizer-init")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the tokenizer has no chat template")
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                             tokenize=False)
    except Exception as e:  # a template that rejects the conversation (jinja raise_exception)
        raise ValueError(f"the chat template cannot render these messages: {e}") from None
    return tokenizer.encode(text, add_special_tokens=False)


def parse_chat(body: dict[str, Any], tokenizer: Any, vocab_size: int) -> OpenAIRequest:
    params, n, stream, usage = _common(body, vocab_size)
    messages = normalize_messages(body.get("messages"))
    tools = check_tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice not in (None, "none", "auto", "required") and not isinstance(choice, dict):
        raise ValueError(f"tool_choice must be 'none', 'auto', 'required' or an object, got {choice!r}")
    if choice == "none":
        tools = None
    forced = forced_tools(choice, tools)
    if forced is not None:
        if any(params.get(k) for k in ("json_schema", "regex", "ebnf")):
            raise ValueError("tool_choice 'required' or a named tool cannot be combined with "
                             "response_format, regex, or ebnf: the tool-call constraint and the "
                             "output constraint cannot both be honored.")
        tools = forced  # SGLang renders only the named tool
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise ValueError("logprobs must be a boolean")
    top = _int_field(body, "top_logprobs", 0, MAX_TOP_LOGPROBS_CHAT) or 0
    if top and not logprobs:
        raise ValueError("top_logprobs needs logprobs to be true")
    ids = render_chat(tokenizer, messages, tools)
    return OpenAIRequest(model=body.get("model") or "", prompts=[ids], params=params, n=n,
                         stream=stream, include_usage=usage, logprobs=logprobs,
                         top_logprobs=top, tools=tools, lora_path=body.get("lora_path"),
                         forced_tools=forced)


def parse_completion(body: dict[str, Any], tokenizer: Any, vocab_size: int) -> OpenAIRequest:
    # max_tokens 0 is prompt scoring (with echo and logprobs), as OpenAI's legacy API and
    # SGLang accept it: the prompt is prefilled, nothing is sampled
    params, n, stream, usage = _common(body, vocab_size, COMPLETION_MAX_TOKENS, min_max_tokens=0)
    if body.get("suffix") is not None:
        raise ValueError("suffix is not supported")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise ValueError("prompt must be a string, a list of strings or a list of token ids")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt = [prompt]
    prompts, texts = [], []
    for p in prompt:
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError("text prompts need a tokenizer; the server runs with --skip-tokenizer-init")
            ids = tokenizer.encode(p, add_special_tokens=True)
            texts.append(p)
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool)
                                               for t in p):
            ids = list(p)
            texts.append(tokenizer.decode(ids) if tokenizer is not None else "")
        else:
            raise ValueError("prompt must be a string, a list of strings or a list of token ids")
        if not ids:
            raise ValueError("prompt cannot be empty")
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {vocab_size - 1}]")
        prompts.append(ids)
    lp = _int_field(body, "logprobs", 0, MAX_LOGPROBS_COMPLETION)
    echo = body.get("echo") or False
    if not isinstance(echo, bool):
        raise ValueError("echo must be a boolean")
    return OpenAIRequest(model=body.get("model") or "", prompts=prompts, params=params, n=n,
                         stream=stream, include_usage=usage, logprobs=lp is not None,
                         top_logprobs=lp or 0, echo=echo, prompt_texts=texts,
                         lora_path=body.get("lora_path"))

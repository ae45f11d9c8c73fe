"""Turn a dataset row into prompt token ids, and the text/token helpers workflows share."""

from __future__ import annotations

from typing import Any

from arealite.api.config.rollout import GenerationHyperparameters

PROMPT_KEYS = ("input_ids", "messages", "prompt", "question")


def render_chat(tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True,
                **template_kwargs: Any) -> str:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the tokenizer has no chat template; give rows `input_ids`, or set "
                         "apply_chat_template=False to tokenize `prompt` as plain text")
    if add_generation_prompt and messages and messages[-1].get("role") == "assistant":
        # A conversation that ends with an assistant turn is a prefill (e.g. "<answer>"): the
        # model continues that turn rather than starting a new one.
        return tokenizer.apply_chat_template(
            messages, tokenize=False, continue_final_message=True, **template_kwargs
        )
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
    )


def encode_text(tokenizer: Any, text: str) -> list[int]:
    # The chat template already wrote any special tokens: add none here.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(
    tokenizer: Any,
    data: dict[str, Any],
    *,
    apply_chat_template: bool = True,
    system_prompt: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[int], str]:
    """Prompt token ids and prompt text of a row, from the first present of ``input_ids``
    (used as is), ``messages`` (chat template; a last assistant turn is continued, see
    ``render_chat``), ``prompt`` or ``question`` (a user message
    through the chat template, or plain text when ``apply_chat_template`` is False)."""
    if not isinstance(data, dict):
        raise TypeError(f"a dataset row must be a dict, got {type(data).__name__}")
    kw = template_kwargs or {}
    if data.get("input_ids") is not None:
        ids = data["input_ids"]
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if not ids or any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in ids):
            raise ValueError("row `input_ids` must be a non-empty list of non-negative ints")
        return ids, tokenizer.decode(ids)
    if data.get("messages") is not None:
        msgs = list(data["messages"])
        if not msgs or not all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs):
            raise ValueError("row `messages` must be a non-empty list of {role, content} dicts")
        if system_prompt and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": system_prompt}, *msgs]
        text = render_chat(tokenizer, msgs, **kw)
        return encode_text(tokenizer, text), text
    for key in ("prompt", "question"):
        if data.get(key) is not None:
            content = str(data[key])
            if apply_chat_template:
                msgs = [{"role": "user", "content": content}]
                if system_prompt:
                    msgs.insert(0, {"role": "system", "content": system_prompt})
                text = render_chat(tokenizer, msgs, **kw)
            else:
                text = content
            ids = encode_text(tokenizer, text)
            if not ids:
                raise ValueError(f"row `{key}` encodes to no tokens")
            return ids, text
    raise ValueError(f"a row needs one of {PROMPT_KEYS}; got keys {sorted(data)}")


def with_stop_tokens(gconfig: GenerationHyperparameters, tokenizer: Any,
                     stop_on_pad: bool = True) -> GenerationHyperparameters:
    """One sample per request, and the tokenizer's EOS (and, with ``stop_on_pad``, its pad)
    among the stop tokens, so a server without the model's generation config still ends
    samples at EOS. Pad stops by default as AReaL's RLVR client sends it (models that pad with
    an end-of-turn token end there); turn it off when pad is an ordinary token of your model."""
    stops = list(gconfig.stop_token_ids)
    pad = getattr(tokenizer, "pad_token_id", None) if stop_on_pad else None
    for tid in (getattr(tokenizer, "eos_token_id", None), pad):
        if isinstance(tid, int) and tid not in stops:
            stops.append(tid)
    return gconfig.new(n_samples=1, stop_token_ids=stops)


def sample_id(data: dict[str, Any]) -> int | None:
    """The row's integer ``id`` (the trainer's proof that no sample is trained twice), if any."""
    sid = data.get("id")
    if hasattr(sid, "item") and getattr(sid, "ndim", 1) == 0:
        sid = sid.item()
    if isinstance(sid, int) and not isinstance(sid, bool):
        return sid
    return None


def check_response(resp: Any, rid: str) -> None:
    n = len(resp.output_tokens)
    if len(resp.output_logprobs) != n or len(resp.output_versions) != n:
        raise ValueError(
            f"request {rid}: the engine returned {n} tokens, {len(resp.output_logprobs)} "
            f"logprobs and {len(resp.output_versions)} versions; they must be equal"
        )

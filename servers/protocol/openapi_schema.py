"""``sampling_params`` typed field by field in the OpenAPI schema of the server and gateway.

At run time ``/generate`` takes ``sampling_params`` as a free JSON object, as SGLang does, so a
wrongly typed value still gets SGLang's contract-gate 400 (servers/protocol/contract.py) and not
FastAPI's validation error. The published schema, though, says what each field takes, with the
bounds the gate enforces, so that a schema-driven client or fuzzer reaches the engine instead of
bouncing off an untyped dict.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model

from servers.protocol.contract import SAMPLING_KEYS
from servers.protocol.request import MAX_STOP


class GenerateReqInput(BaseModel):
    """The body FastAPI validates (SGLang's GenerateReqInput fields that matter here)."""

    model_config = ConfigDict(extra="ignore")
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    return_prompt_token_ids: bool = False
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0


def sampling_params_model(vocab_size: int | None) -> type[BaseModel]:
    """SGLang's ``SamplingParams`` with the embedded server's bounds (``vocab_size`` bounds the
    token ids when it is known: a server knows its model, a gateway does not)."""
    token = Annotated[int, Field(ge=0, lt=vocab_size)] if vocab_size else Annotated[int, Field(ge=0)]
    strings = str | Annotated[list[str], Field(max_length=MAX_STOP)] | None
    fields: dict[str, Any] = {
        "max_new_tokens": (Annotated[int, Field(ge=0)] | None, 128),
        "stop": (strings, None),
        "stop_token_ids": (list[token] | None, None),
        "stop_regex": (strings, None),
        "temperature": (Annotated[float, Field(ge=0.0)], 1.0),
        "top_p": (Annotated[float, Field(gt=0.0, le=1.0)], 1.0),
        "top_k": (Annotated[int, Field(ge=-1)], -1),
        "min_p": (Annotated[float, Field(ge=0.0, le=1.0)], 0.0),
        "frequency_penalty": (Annotated[float, Field(ge=-2.0, le=2.0)], 0.0),
        "presence_penalty": (Annotated[float, Field(ge=-2.0, le=2.0)], 0.0),
        "repetition_penalty": (Annotated[float, Field(gt=0.0, le=2.0)], 1.0),
        "min_new_tokens": (Annotated[int, Field(ge=0)], 0),
        "n": (Annotated[int, Field(ge=1)], 1),
        "json_schema": (str | None, None),
        "regex": (str | None, None),
        "ebnf": (str | None, None),
        "structural_tag": (str | None, None),
        "ignore_eos": (bool, False),
        "skip_special_tokens": (bool, True),
        "spaces_between_special_tokens": (bool, True),
        "no_stop_trim": (bool, False),
        "stream_interval": (Annotated[int, Field(ge=1)] | None, None),
        "logit_bias": (dict[str, float] | None, None),
        "sampling_seed": (int | None, None),
        "custom_params": (dict[str, Any] | None, None),
        "beam_width": (Annotated[int, Field(ge=1)] | None, None),
        "watermark": (dict[str, Any] | None, None),
        "choice": (list[str] | None, None),
    }
    assert tuple(fields) == SAMPLING_KEYS, "keep in step with the contract gate's keys"
    return create_model(
        "SamplingParams", __config__=ConfigDict(extra="forbid"), **fields
    )


def install(app: FastAPI, vocab_size: int | None, body_model: type[BaseModel] = GenerateReqInput,
            generate_paths: tuple[str, ...] = ("/generate",)) -> None:
    """Publish ``body_model`` (with typed ``sampling_params``) as the request body of
    ``generate_paths`` in ``app``'s OpenAPI schema. Run-time validation is unchanged."""
    default = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = default()
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        tmpl = "#/components/schemas/{model}"
        for name, model in (("SamplingParams", sampling_params_model(vocab_size)),
                            (body_model.__name__, body_model)):
            js = TypeAdapter(model).json_schema(ref_template=tmpl)
            comps.update(js.pop("$defs", {}))
            comps[name] = js
        ref = {"$ref": "#/components/schemas/SamplingParams"}
        props = comps[body_model.__name__]["properties"]
        props["sampling_params"] = {
            "anyOf": [ref, {"type": "array", "items": ref}, {"type": "null"}]}
        tok: dict[str, Any] = {"type": "integer", "minimum": 0}
        if vocab_size:
            tok["maximum"] = vocab_size - 1
        props["input_ids"] = {"anyOf": [
            {"type": "array", "items": tok, "minItems": 1},
            {"type": "array", "items": {"type": "array", "items": tok, "minItems": 1}, "minItems": 1},
            {"type": "null"}]}
        body_ref = {"$ref": f"#/components/schemas/{body_model.__name__}"}
        for path in generate_paths:
            for op in schema["paths"].get(path, {}).values():
                op["requestBody"] = {"required": True, "content": {
                    "application/json": {"schema": body_ref}}}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]

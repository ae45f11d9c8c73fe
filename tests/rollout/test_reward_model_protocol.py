"""The reward-model wire format: the client's body and the embedded server's request model use
only fields of SGLang's own ``EmbeddingReqInput`` (read from the installed sglang source, whose
runtime cannot be imported here), and answers parse into ``Segment.scores`` or fail clearly."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.backends.base import ProtocolError
from arealite.rollout.reward_model_client import (
    SGLANG_SCORE,
    encode_score_body,
    parse_score_response,
)


def _sglang_embedding_fields() -> set[str]:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang (--no-deps) not installed")
    src = Path(spec.submodule_search_locations[0]) / "srt" / "managers" / "io_struct.py"
    for node in ast.parse(src.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == "EmbeddingReqInput":
            return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
    raise AssertionError("sglang's io_struct has no EmbeddingReqInput")


def test_bodies_use_sglang_fields():
    fields = _sglang_embedding_fields()
    body = json.loads(encode_score_body([1, 2, 3], GenerationHyperparameters(), 0, "r-1"))
    assert body == {"input_ids": [1, 2, 3], "rid": "r-1"}
    assert set(body) <= fields
    from servers.routes.embedding import EmbeddingReqInput

    assert set(EmbeddingReqInput.model_fields) <= fields
    assert SGLANG_SCORE.generate_path == "/classify"


def test_parse_answers():
    meta = {"id": "r", "finish_reason": {"type": "length", "length": 0}, "prompt_tokens": 3,
            "weight_version": "default"}
    seg = parse_score_response({"embedding": [0.25], "meta_info": meta}, 0)
    assert seg.scores == [0.25] and seg.finish_type == "stop" and seg.output_ids == []
    assert parse_score_response([{"embedding": [1, 2], "meta_info": meta}], 0).scores == [1.0, 2.0]
    for bad in ({"embedding": [0.1]}, {"embedding": [], "meta_info": meta},
                {"embedding": [None], "meta_info": meta}, [1, 2], "x"):
        with pytest.raises(ProtocolError):
            parse_score_response(bad, 0)

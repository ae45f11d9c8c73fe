import pytest

from arealite.api.config import GenerationHyperparameters
from arealite.api.io_struct import (
    FinetuneSpec,
    LLMRequest,
    ModelRequest,
    ParamSpec,
    WeightUpdateMeta,
    WeightUpdateType,
)


def test_request_validation():
    ModelRequest(input_ids=[1, 2]).validate()
    assert LLMRequest is ModelRequest
    for bad in ([], [1, -2], [1, 2.5], [True]):
        with pytest.raises(ValueError):
            ModelRequest(input_ids=bad).validate()
    with pytest.raises(ValueError):
        ModelRequest(rid="", input_ids=[1]).validate()
    with pytest.raises(ValueError):
        GenerationHyperparameters(max_new_tokens=-1)


def test_weight_update_meta():
    m = WeightUpdateMeta(type="disk", path="/tmp/w", version=3)
    assert m.type is WeightUpdateType.DISK and m.disk_ready_marker.startswith("/tmp/w/")
    with pytest.raises(ValueError):
        WeightUpdateMeta(type="disk")
    with pytest.raises(ValueError):
        WeightUpdateMeta(type="ftp", path="x")


def test_specs():
    assert ParamSpec("w", (3, 4), "bfloat16").nbytes == 24
    assert FinetuneSpec(2, 100, 32).total_train_steps == 6

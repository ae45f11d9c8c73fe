import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.io_struct import (
    DISK_READY_MARKER,
    FinetuneSpec,
    LLMRequest,
    ModelRequest,
    ParamSpec,
    WeightUpdateMeta,
    WeightUpdateType,
    token_ids_json,
)


def test_request_validation():
    assert json.loads(ModelRequest(input_ids=[1, 2]).validate()) == [1, 2]
    assert json.loads(ModelRequest(input_ids=(3, 0)).validate()) == [3, 0]  # any int sequence
    assert LLMRequest is ModelRequest
    for bad, named in (([], "empty"), ([1, -2], "non-negative"), ([1, 2.5], "float"),
                       ([True], "bool"), ([[3]], "list"), (["5"], "str"), ([1, None], "NoneType")):
        with pytest.raises(ValueError, match=named):
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


@given(st.lists(st.integers(0, 2**64), min_size=1, max_size=50))
def test_token_ids_json_is_the_json_of_plain_ids(ids):
    assert json.loads(token_ids_json(ids)) == ids


@given(
    st.lists(st.integers(0, 99), max_size=5),
    st.sampled_from([-1, True, False, 2.0, None, "7", [3], [], (1,), {"a": 1}, float("nan")]),
    st.integers(0, 5),
)
def test_token_ids_json_refuses_anything_but_non_negative_ints(ids, bad, at):
    ids.insert(min(at, len(ids)), bad)
    assert token_ids_json(ids) is None
    assert token_ids_json([]) is None and token_ids_json(tuple(range(3))) is None


def test_weight_update_meta_constructors_and_marker(tmp_path):
    d = WeightUpdateMeta.disk(3, tmp_path)
    assert d.type is WeightUpdateType.DISK and d.path == str(tmp_path / "v3") and d.version == 3
    (tmp_path / "v3").mkdir()
    d.write_disk_marker()
    assert d.read_disk_marker() == 3 and not (tmp_path / "v3" / (DISK_READY_MARKER + ".tmp")).exists()
    b = WeightUpdateMeta.broadcast(4, [], 1234, bucket_size_mb=8.0, timeout=9.0)
    assert (b.type, b.version, b.master_port, b.bucket_size_mb, b.timeout) == (
        WeightUpdateType.DISTRIBUTED, 4, 1234, 8.0, 9.0)

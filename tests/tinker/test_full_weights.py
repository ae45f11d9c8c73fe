"""Full-weight training through ``arealite tinker-server``, driven by the official ``tinker`` SDK.

The SDK's public API creates LoRA training clients only (``create_lora_training_client``); its
wire model (``CreateModelRequest.lora_config``) is optional, and a model created without one
trains every weight here. ``full_weight_client`` (tests/support/tinker_sdk.py) sends that request with the SDK's own low-level
client and wraps the model in the SDK's ``TrainingClient``, as ``create_lora_training_client``
does; everything after is the SDK's public API. Its own service: a full-weight model replaces
the servers' weights, so it trains alone on a service (refused beside LoRA clients).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.tinker_sdk import full_weight_client, tinker_service

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.integration
KEY = "tml-arealite-full"


@pytest.fixture(scope="module")
def client(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("tinker_full")
    with tinker_service(tiny_model_dir, root, KEY, ["--random-seed", "0"]) as url:
        yield tinker.ServiceClient(base_url=url, api_key=KEY)


def _datum(ids: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:]})


def test_full_weight_training_pushes_and_pins(client, tiny_model_dir):
    name = str(tiny_model_dir)
    base = client.create_sampling_client(base_model=name).result()
    probe = types.ModelInput.from_ints([7, 8, 9, 10, 11, 12, 13])
    base_lp = base.compute_logprobs(probe).result()

    tc = full_weight_client(client, name)
    info = tc.get_info()
    assert not info.is_lora and info.lora_rank is None
    data = [_datum([7, 8, 9, 10, 11, 12, 13]), _datum([5, 6, 7, 8])]
    before = tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert after < before

    # the push: the sampling client's log-probs are the trainer's on the same weights
    sampler = tc.save_weights_and_get_sampling_client().result()
    lp = sampler.compute_logprobs(probe).result()
    trainer = tc.forward([data[0]], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    np.testing.assert_allclose(lp[1:], trainer.tolist(), atol=2e-4)
    assert max(abs(a - b) for a, b in zip(lp[1:], base_lp[1:])) > 1e-3
    seqs = sampler.sample(probe, 2, types.SamplingParams(max_tokens=4)).result().sequences
    assert all(len(s.tokens) == len(s.logprobs) > 0 for s in seqs)

    # the servers now hold that version: the base-model client is refused, not answered
    with pytest.raises(tinker.RequestFailedError, match="not the base model"):
        base.compute_logprobs(probe).result()
    # a newer push: the older sampling client is refused rather than answered from it
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    newer = tc.save_weights_and_get_sampling_client().result()
    assert newer.compute_logprobs(probe).result() != lp
    with pytest.raises(tinker.RequestFailedError, match="create a new sampling client"):
        sampler.compute_logprobs(probe).result()

    # it trains alone on its service: LoRA (or a second full-weight model) is refused
    with pytest.raises(tinker.RequestFailedError, match="only training client"):
        client.create_lora_training_client(base_model=name, rank=2).result()

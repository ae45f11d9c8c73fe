"""The official ``tinker`` SDK, unmodified, against ``arealite tinker-server`` on the tiny model
and one embedded server (LoRA adapters on): SFT, an RL loop, sampler/trainer log-prob parity,
sampling clients pinned to their version while training goes on, checkpoints, errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.support.tinker_sdk import full_weight_client, tinker_service

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.integration
KEY = "tml-arealite-test"


@pytest.fixture(scope="module")
def service(tiny_model_dir, tmp_path_factory):
    """``base_url`` of a Tinker service over one embedded server."""
    root = tmp_path_factory.mktemp("tinker")
    with tinker_service(tiny_model_dir, root, KEY, ["--enable-lora", "--max-lora-rank", "8",
                                                    "--random-seed", "0"]) as url:
        yield url


@pytest.fixture(scope="module")
def client(service):
    return tinker.ServiceClient(base_url=service, api_key=KEY)


@pytest.fixture(scope="module")
def model_name(tiny_model_dir) -> str:
    return str(tiny_model_dir)


def _datum(ids: list[int], **inputs) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], **inputs})


def test_capabilities_name_the_local_model(client, model_name):
    caps = client.create_rest_client().get_server_capabilities().result()
    assert [m.model_name for m in caps.supported_models] == [model_name]


def test_sft_step_lowers_the_loss(client, model_name):
    tc = client.create_lora_training_client(base_model=model_name, rank=4).result()
    assert tc.get_info().lora_rank == 4
    tok = tc.get_tokenizer()
    batch = [_datum(tok.encode(s)) for s in ("12+7=19", "3+4=7", "20+22=42")]
    before = tc.forward_backward(batch, "cross_entropy").result().metrics["loss:sum"]
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = tc.forward(batch, "cross_entropy").result().metrics["loss:sum"]
    assert after < before


def test_rl_loop_with_logprob_parity(client, model_name):
    """sample -> reward -> importance_sampling forward_backward -> optim_step -> new sampling
    client; at each step the sampler's log-probs are the trainer's on the same weights."""
    tc = client.create_lora_training_client(base_model=model_name, rank=4, seed=3).result()
    prompt = [5, 17, 42, 9]
    samplers = []
    for _ in range(3):
        sc = tc.save_weights_and_get_sampling_client()
        res = sc.sample(types.ModelInput.from_ints(prompt), 4,
                        types.SamplingParams(max_tokens=6, temperature=1.0)).result()
        seqs = res.sequences
        assert len(seqs) == 4 and all(len(s.tokens) == len(s.logprobs) > 0 for s in seqs)
        rewards = np.array([np.mean([t % 2 == 0 for t in s.tokens]) for s in seqs])
        adv = rewards - rewards.mean()
        data = []
        for s, a in zip(seqs, adv):
            full = prompt + list(s.tokens)
            n_prompt = len(prompt) - 1
            data.append(_datum(full, logprobs=[0.0] * n_prompt + list(s.logprobs),
                               advantages=[0.0] * n_prompt + [float(a)] * len(s.tokens)))
        # parity: the trainer's log-probs of the sampled tokens on the weights sampled from
        fwd = tc.forward(data, "cross_entropy").result()
        for s, out in zip(seqs, fwd.loss_fn_outputs):
            trainer = out["logprobs"].tolist()[len(prompt) - 1:]
            np.testing.assert_allclose(trainer, s.logprobs, atol=2e-4)
        out = tc.forward_backward(data, "importance_sampling").result()
        assert np.isfinite(out.metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=5e-3)).result()
        samplers.append(sc)
    # each new sampling client samples the weights after the steps before it
    first, last = (s.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
                   for s in (samplers[0], samplers[-1]))
    assert max(abs(a - b) for a, b in zip(first[1:], last[1:])) > 1e-4


def test_sampling_client_keeps_its_version_while_training_goes_on(client, model_name):
    tc = client.create_lora_training_client(base_model=model_name, rank=4, seed=4).result()
    probe = types.ModelInput.from_ints([7, 8, 9, 10, 11, 12, 13])
    data = [_datum([7, 8, 9, 10, 11, 12, 13])]
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    pinned = tc.save_weights_and_get_sampling_client().result()
    ref = pinned.compute_logprobs(probe).result()
    trainer_ref = tc.forward(data, "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    np.testing.assert_allclose(ref[1:], trainer_ref.tolist(), atol=2e-4)

    later: list[list] = []
    errors: list[BaseException] = []

    def train() -> None:
        try:
            for _ in range(3):
                tc.forward_backward(data, "cross_entropy").result()
                tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
                s = tc.save_weights_and_get_sampling_client().result()
                later.append(s.compute_logprobs(probe).result())
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    t = threading.Thread(target=train, daemon=True)
    t.start()
    reads = 0
    while t.is_alive() or reads < 3:
        assert pinned.compute_logprobs(probe).result() == ref  # exactly its own weights
        reads += 1
    t.join(timeout=300)
    assert not errors, errors
    assert len(later) == 3
    for lp in later:  # the newer versions did move
        assert max(abs(a - b) for a, b in zip(lp[1:], ref[1:])) > 1e-3
    assert pinned.compute_logprobs(probe).result() == ref


def test_save_and_load_state_round_trip(client, model_name):
    tc = client.create_lora_training_client(base_model=model_name, rank=4, seed=5).result()
    data = [_datum([3, 30, 31, 32, 33, 34])]
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    saved = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
    path = tc.save_state("ck").result().path
    assert path.startswith("tinker://")
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    moved = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert moved != pytest.approx(saved, abs=1e-6)
    tc.load_state_with_optimizer(path).result()
    assert tc.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        saved, abs=1e-5)


def test_errors_in_the_sdks_shapes(service, client, model_name):
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=service, api_key="tml-wrong-key"
                             ).create_lora_training_client(base_model=model_name, rank=2)
    with pytest.raises(tinker.RequestFailedError, match="base_model"):
        client.create_lora_training_client(base_model="no/such-model", rank=4).result()
    tc = client.create_lora_training_client(base_model=model_name, rank=2).result()
    with pytest.raises(tinker.RequestFailedError, match="needs loss_fn_inputs"):
        tc.forward_backward([_datum([4, 5, 6])], "ppo").result()
    # the bad request cost nothing: the same client still trains
    out = tc.forward_backward([_datum([4, 5, 6])], "cross_entropy").result()
    assert np.isfinite(out.metrics["loss:sum"])


def test_full_weight_model_is_refused_beside_lora_clients(client, model_name):
    """A full-weight model would replace the weights under the LoRA clients' adapters."""
    client.create_lora_training_client(base_model=model_name, rank=2).result()
    with pytest.raises(tinker.RequestFailedError, match="service of its own"):
        full_weight_client(client, model_name)

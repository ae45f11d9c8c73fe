"""Many requests with different sampling settings share the engine's batch, and each is served
with its *own* settings.

Rows are freed and refilled as requests arrive and finish at different times, and finished
``Sequence`` objects are dropped as soon as their results are copied out, so Python hands their
memory (and their ``id()``) to later sequences. A cache keyed by object identity would then
serve a new request with a dead one's temperature, top-k and top-p (AReaL's client caught
exactly that). Every response is checked against a teacher-forced recompute with its own
settings, by a slow reference written here, not with the engine's sampling code.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict

import pytest

from servers.engine.engine import Engine
from servers.engine.model_runner import ModelRunner
from servers.engine.sequence import Sequence
from servers.protocol.request import SamplingParams
from tests.support.sampling_reference import check_against_own_settings


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    return ModelRunner(str(tiny_model_dir))


def random_settings(rng: random.Random) -> dict:
    """One request's raw ``sampling_params``: greedy, or sampled with a mix of filters."""
    kind = rng.choice(["greedy", "greedy", "temp", "topk", "topp", "seeded", "penalty"])
    sp: dict = {"ignore_eos": True, "max_new_tokens": rng.randint(1, 16)}
    if kind == "greedy":
        sp["temperature"] = 0.0
        return sp
    sp["temperature"] = rng.choice([0.5, 0.8, 1.3, 2.0])
    if kind == "topk":
        sp["top_k"] = rng.choice([2, 5, 20])
    elif kind == "topp":
        sp["top_p"] = rng.choice([0.5, 0.8, 0.95])
    elif kind == "seeded":
        sp["sampling_seed"] = rng.choice([7, 11])
        sp["top_k"] = 20
        sp["max_new_tokens"] = 8  # same seed, prompt and settings must give the same tokens
    elif kind == "penalty":
        sp["frequency_penalty"] = rng.choice([0.0, 0.7])
        sp["presence_penalty"] = rng.choice([0.0, 0.5])
        sp["repetition_penalty"] = rng.choice([1.0, 1.4])
    return sp


def run_clients(engine: Engine, vocab: int, n_clients: int, per_client: int, seed: int):
    """``n_clients`` threads each send ``per_client`` requests one after another. A finished
    Sequence is dropped at once, so its memory (and id) is free for the next one."""
    records: list[dict] = []
    ids: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(c: int) -> None:
        rng = random.Random(seed * 1000 + c)
        try:
            for i in range(per_client):
                sp = random_settings(rng)
                if "sampling_seed" in sp:
                    prompt = [5, 6, 7, 8]
                else:
                    prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 8))]
                done = threading.Event()
                seq = Sequence(rid=f"c{c}-{i}", prompt=prompt, return_logprob=True,
                               params=SamplingParams.from_dict(sp, vocab))
                seq.on_event = lambda s, n, final, done=done: done.set() if final else None
                with lock:
                    ids.append(id(seq))
                engine.submit(seq)
                assert done.wait(60), f"request c{c}-{i} did not finish"
                rec = {"rid": seq.rid, "prompt": prompt, "sp": sp, "finish": seq.finish,
                       "output_ids": list(seq.output_ids), "logprobs": list(seq.output_logprobs)}
                del seq  # the engine has let go too: the next Sequence may reuse this memory
                with lock:
                    records.append(rec)
                if rng.random() < 0.3:
                    threading.Event().wait(rng.random() * 0.003)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[0]
    assert len(records) == n_clients * per_client
    return records, ids


@pytest.mark.parametrize("n_clients,per_client", [(1, 60), (2, 40), (6, 30)])
def test_every_request_is_sampled_with_its_own_settings(runner, n_clients, per_client):
    engine = Engine(runner, weight_version="v0", random_seed=0)
    engine.start()
    try:
        records, ids = run_clients(engine, runner.vocab_size, n_clients, per_client, seed=n_clients)
    finally:
        engine.shutdown()
    # The scenario that broke the identity-keyed cache did happen: ids were reused.
    assert len(set(ids)) < len(ids), "no id() was reused; the test did not exercise reuse"
    kinds = {("greedy" if r["sp"]["temperature"] == 0.0 else r["sp"]["temperature"]) for r in records}
    assert len(kinds) >= 4, kinds  # greedy and several temperatures really were mixed
    for rec in records:
        assert rec["finish"] == {"type": "length", "length": rec["sp"]["max_new_tokens"]}
        check_against_own_settings(runner.model, rec)
    # Seeded requests with one prompt and one setting give one output, whatever shared the batch.
    by_setting: dict = defaultdict(set)
    for rec in records:
        if "sampling_seed" in rec["sp"]:
            by_setting[tuple(sorted(rec["sp"].items()))].add(tuple(rec["output_ids"]))
    assert by_setting and all(len(outs) == 1 for outs in by_setting.values()), by_setting

"""``push_weights`` over a real broadcast to two embedded servers when one goes wrong.

- A server killed inside the broadcast (between two buckets): the client takes it out, the
  trainer's upload fails at once (gloo sees the peer gone), and the update is retried over the
  survivor, which ends verified on the new weights: no restart of the trainer, no timeout.
- A server killed after it was paused but before it joined the weight-update group: the
  trainer would wait in the rendezvous for a rank that never comes (until the group timeout);
  the client's ``meta.abort_reason`` ends that wait, and the retry succeeds on the survivor.
- A server whose weights differ after the broadcast (checksums): it is sent the weights again,
  alone, verified and re-admitted.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest
import torch

from arealite.api.io_struct import FinetuneSpec, WeightUpdateMeta
from arealite.engine.ppo.actor import FSDPPPOActor
from arealite.utils.network import find_free_port
from arealite.weights.push import push_weights
from tests.rollout.test_remote_engine_integration import make_engine
from tests.support.fsdp_helpers import actor_config
from tests.support.procs import embedded_servers
from tests.weights.test_fsdp_weight_upload import (
    _post,
    _train_step,
    server_logprobs,
    trainer_logprobs,
)
from tests.weights.test_verify_integration import corrupt

pytestmark = pytest.mark.integration

IDS = list(range(5, 19))


@pytest.fixture(scope="module")
def actor(tiny_model_dir):
    a = FSDPPPOActor(actor_config(tiny_model_dir, recompute_logprob=False, use_decoupled_loss=False),
                     device="cpu", backend="gloo")
    a.initialize(ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=8, train_batch_size=1))
    yield a
    a.destroy()


@pytest.fixture
def pool(tiny_model_dir):
    """Two servers (addr, proc) and a client over them."""
    with embedded_servers(tiny_model_dir, 2, ["--weight-version", "0"]) as servers:
        eng = make_engine([a for a, _ in servers], health_check_interval=0.5)
        try:
            yield servers, eng
        finally:
            eng.destroy()


def kill(proc) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def broadcast_meta(actor: FSDPPPOActor, group: str) -> WeightUpdateMeta:
    meta = WeightUpdateMeta.broadcast(1, actor.get_param_specs(0.02), find_free_port(),
                                      group_name=group, timeout=60)
    meta.verify = True
    return meta


def assert_serves_trainer_weights(addr: str, actor: FSDPPPOActor) -> None:
    assert str(_post(addr, "/model_info")["weight_version"]) == "1"
    diff = float((server_logprobs(addr, IDS) - trainer_logprobs(actor, IDS)).abs().max())
    assert diff < 1e-5


def test_a_server_killed_inside_a_broadcast_is_dropped_and_the_update_retried(pool, actor, caplog):
    (a, _), (b, proc_b) = pool[0]
    eng = pool[1]
    _train_step(actor, seed=51)  # the servers now hold stale weights
    real, calls = eng.weight_sync.fan_out, {"n": 0}

    async def kill_at_third_bucket(session, addrs, path, *args, **kw):
        if path == "/update_weights_from_distributed":
            calls["n"] += 1
            if calls["n"] == 3:
                kill(proc_b)
        return await real(session, addrs, path, *args, **kw)

    eng.weight_sync.fan_out = kill_at_third_bucket
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
        push_weights(actor, eng, broadcast_meta(actor, "wu_kill"), 0, 90, retries=1)
    assert time.monotonic() - t0 < 30, "a retry costs about one update, not a timeout"
    assert "retrying over the live servers" in caplog.text
    assert eng.pool.healthy_addrs() == [a] and eng.get_version() == 1
    assert eng.last_weight_update.updated == [a]  # and verified: checksums equal the trainer's
    assert_serves_trainer_weights(a, actor)


def test_a_server_dead_before_it_joins_the_group_does_not_hold_the_trainer(pool, actor):
    (a, _), (b, proc_b) = pool[0]
    eng = pool[1]
    _train_step(actor, seed=52)
    real = eng.weight_sync.fan_out

    async def kill_after_begin(session, addrs, path, *args, **kw):
        out = await real(session, addrs, path, *args, **kw)
        if path == "/begin_weight_update" and proc_b.poll() is None:
            kill(proc_b)  # paused and begun, then gone before /init_weights_update_group
        return out

    eng.weight_sync.fan_out = kill_after_begin
    t0 = time.monotonic()
    push_weights(actor, eng, broadcast_meta(actor, "wu_join"), 0, 90, retries=1)
    # without the abort, the trainer and the survivor wait out the group timeout (60 s)
    assert time.monotonic() - t0 < 30
    assert eng.pool.healthy_addrs() == [a]
    assert_serves_trainer_weights(a, actor)


def test_no_retry_left_stops_the_run_with_the_reason(pool, actor):
    (a, _), (b, proc_b) = pool[0]
    eng = pool[1]
    real = eng.weight_sync.fan_out

    async def kill_at_first_bucket(session, addrs, path, *args, **kw):
        if path == "/update_weights_from_distributed" and proc_b.poll() is None:
            kill(proc_b)
        return await real(session, addrs, path, *args, **kw)

    eng.weight_sync.fan_out = kill_at_first_bucket
    with pytest.raises(Exception, match=b.replace(".", r"\.")):
        push_weights(actor, eng, broadcast_meta(actor, "wu_noretry"), 0, 90, retries=0)
    assert eng.get_version() == 0


def test_a_checksum_mismatch_after_a_broadcast_is_resent_and_verified(pool, actor, caplog):
    (a, _), (b, _) = pool[0]
    eng = pool[1]
    _train_step(actor, seed=53)
    real = eng.verifier.after_update

    async def corrupted_then_verified(session, report, meta, on_disk):
        assert not on_disk  # a broadcast leaves no copy: the re-sync goes through the trainer
        shape = dict(actor.model.named_parameters())["model.norm.weight"].shape
        corrupt(b, "model.norm.weight", torch.zeros(shape))
        await real(session, report, meta, on_disk)

    eng.verifier.after_update = corrupted_then_verified
    with caplog.at_level(logging.WARNING):
        push_weights(actor, eng, broadcast_meta(actor, "wu_resync"), 0, 90)
    assert "WEIGHT MISMATCH" in caplog.text and f"server {b} re-synced to v1 and verified" in caplog.text
    assert sorted(eng.pool.healthy_addrs()) == sorted([a, b])
    for addr in (a, b):
        assert_serves_trainer_weights(addr, actor)

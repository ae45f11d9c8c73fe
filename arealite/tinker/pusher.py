"""A Tinker model's weight pushes to the server pool: ``save_weights_for_sampler`` is arealite's
versioned push (``arealite.weights.push.push_weights`` over the transport the config and the
backend allow: an adapter from memory or disk for LoRA, disk / tensor / broadcast for every
weight), driven by an arealite pool client of its own.

A LoRA model's versions stay loaded on the servers side by side (``keep_versions`` older ones,
by default all of them: the client's staleness bound, past which it unloads them), so a
sampling client can name its own version for as long as it lives.
"""

from __future__ import annotations

from pathlib import Path

from arealite.api.config.rollout import InferenceEngineConfig
from arealite.api.config.weights import WeightUpdateConfig
from arealite.api.io_struct import VersionClock
from arealite.backends.sglang import SGLANG
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.rollout.remote_engine import RemoteInferenceEngine
from arealite.weights.push import WeightPushPlan, push_weights


class WeightPusher:
    """The pool client and transport plan of one model's pushes."""

    def __init__(self, rollout: InferenceEngineConfig, wu: WeightUpdateConfig, lora: bool,
                 disk_root: Path, keep_versions: int) -> None:
        # the client unloads adapter versions older than its staleness bound
        self.client = RemoteInferenceEngine(
            rollout.model_copy(update={"max_head_offpolicyness": keep_versions}))
        self.client.initialize(None, train_data_parallel_size=1)
        self.plan = WeightPushPlan.choose(wu, lora, SGLANG, False, disk_root, 0)

    @property
    def clock(self) -> VersionClock:
        """The version clock the trainer engine shares (moved by each push)."""
        return self.client.clock

    @property
    def addrs(self) -> list[str]:
        return list(self.client.addresses)

    def push(self, engine: FSDPEngine, version: int) -> str | None:
        """The servers to ``engine``'s weights as ``version``; the adapter's name for LoRA."""
        meta = self.plan.meta(version, engine)
        push_weights(engine, self.client, meta, 0, self.plan.wu.timeout, self.plan.wu.retries)
        return meta.lora_name

    def destroy(self) -> None:
        self.client.destroy()

"""``RLEngines`` over fakes that record what the RL phases ask of them, in one shared ``calls``
list (so a test reads the order across engines): no servers, no model, no process group."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from arealite.api.config.experiment import GRPOConfig
from arealite.api.config.loader import load_config
from arealite.api.io_struct import FinetuneSpec
from arealite.rollout.data_cycle import DataCycle
from arealite.trainer.rl_engines import RLEngines
from arealite.weights.disk import DiskTransport
from arealite.weights.push import WeightPushPlan

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "toy_grpo_sync.yaml"


def grpo_config(fileroot: Path, *overrides: str) -> GRPOConfig:
    return load_config(str(CONFIG), [f"cluster.fileroot={fileroot}", "stats_logger.tensorboard=false",
                                     "weight_update.type=disk", *overrides], GRPOConfig)


def trajectories(n: int = 2, version: int = 0) -> dict[str, torch.Tensor]:
    return {"loss_mask": torch.ones(n, 3, dtype=torch.bool), "rewards": torch.ones(n),
            "attention_mask": torch.ones(n, 4, dtype=torch.bool),
            "versions": torch.full((n, 3), version), "sample_ids": torch.arange(n)}


class FakeRollout:
    last_weight_update = None

    def __init__(self, calls: list[tuple], name: str = "rollout") -> None:
        self.calls, self.name = calls, name

    def _call(self, *what: Any) -> None:
        self.calls.append((self.name, *what))

    def initialize(self, addr: Any = None, train_data_parallel_size: int = 1) -> None:
        self._call("initialize")

    def restore(self, version: int) -> None:
        self._call("restore", version)

    def load_data_state(self, state: dict) -> None:
        self._call("load_data_state", state)

    def data_state(self) -> dict:
        return {"epoch": 1, "replay": [["in flight"]]}

    def idle_stats(self) -> dict[str, float]:
        return {"rollout/idle_ratio": 0.5}

    def take_dropped(self) -> list[dict]:  # the ledger's drops: none here
        return []

    def inflight_tagged(self) -> list[tuple]:
        return [({"id": 7}, 1)]

    def prepare_batch(self, loader: Any, workflow: Any, should_accept: Any = None) -> dict:
        self._call("prepare_batch", should_accept)
        return trajectories()

    def rollout_batch(self, rows: list, workflow: Any, should_accept: Any = None) -> dict:
        self._call("rollout_batch", [r["id"] for r in rows])
        return trajectories(len(rows))

    def pause(self) -> None:
        self._call("pause")

    def resume(self) -> None:
        self._call("resume")

    def update_weights(self, meta: Any) -> Future:
        self._call("update_weights", meta.version)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def set_version(self, version: int) -> None:
        self._call("set_version", version)

    def destroy(self) -> None:
        self._call("destroy")


class FakeActor:
    def __init__(self, calls: list[tuple]) -> None:
        self.calls = calls

    def save(self, meta: Any) -> None:
        self.calls.append(("actor", "save", meta.weight_format, Path(meta.path).name))

    def load(self, meta: Any) -> None:
        self.calls.append(("actor", "load", meta.weight_format, meta.path))

    def upload_weights(self, meta: Any) -> None:
        self.calls.append(("actor", "upload_weights", meta.version))

    def prepare_prox_logp(self, batch: dict) -> None:
        self.calls.append(("actor", "prepare_prox_logp"))

    def compute_advantages(self, batch: dict) -> None:
        self.calls.append(("actor", "compute_advantages"))

    def compute_logp(self, batch: dict) -> torch.Tensor:  # as the reference model
        self.calls.append(("ref", "compute_logp"))
        return torch.zeros(1)

    def ppo_update(self, batch: dict) -> dict[str, float]:
        self.calls.append(("actor", "ppo_update"))
        return {"actor/loss": 0.0}

    def destroy(self) -> None:
        self.calls.append(("actor", "destroy"))


class FakeLoader:
    """A loader position: ``pos`` rows handed out."""

    def __init__(self, rows: list[dict] | None = None) -> None:
        self.rows, self.pos = rows or [], 0

    def __iter__(self):
        for i in range(self.pos, len(self.rows), 2):
            self.pos = i + 2
            yield self.rows[i:i + 2]

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]


class FakeEvalRollout(FakeRollout):
    def rollout_batch(self, rows: list, workflow: Any, should_accept: Any = None) -> dict:
        self._call("evaluate", len(rows))
        return {"rewards": torch.full((len(rows),), 0.25)}


def fake_engines(config: GRPOConfig, calls: list[tuple], steps: int = 5, valid_rows: int = 2,
                 **fields: Any) -> RLEngines:
    """``steps`` steps in one epoch; ``fields`` replace the defaults (``keep``, ``colocated``, ...)."""
    rows = [{"id": i} for i in range(2 * steps)]
    defaults: dict[str, Any] = dict(
        config=config, rank=0, world=1, tokenizer=None, processor=None, loader=FakeLoader(rows),
        valid_rows=[{"id": -i} for i in range(valid_rows)], ft=FinetuneSpec(1, 2 * steps, 2),
        cycle=DataCycle(), rollout=FakeRollout(calls), eval_rollout=FakeEvalRollout(calls, "eval"),
        actor=FakeActor(calls), ref=None, critic=None, reward_model=None, workflow=None,
        eval_workflow=None, eval_fn=None, pushes=WeightPushPlan(DiskTransport, config.weight_update,
                                                           config.run_dir("weights"), 0), keep=None, colocated=None)
    return RLEngines(**{**defaults, **fields})

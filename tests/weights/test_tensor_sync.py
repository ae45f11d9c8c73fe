"""The client's half of a tensor update: it publishes the paused servers to the trainer and
waits for the trainer's report (which servers failed), an abort, or its timeout."""

from __future__ import annotations

import asyncio
import threading
import time

from arealite.api.io_struct import WeightUpdateMeta
from arealite.weights.tensor_sync import await_tensor_push


def trainer(meta: WeightUpdateMeta, report: dict[str, str] | None = None,
            abort: str | None = None) -> threading.Thread:
    """A trainer rank 0 that waits for the targets, then reports (or aborts)."""
    def run() -> None:
        while meta.targets is None:
            time.sleep(0.001)
        if abort:
            meta.abort_reason = abort
        else:
            meta.target_failures = report or {}
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_publishes_targets_and_reports_per_server_failures():
    meta = WeightUpdateMeta.tensor(3)
    trainer(meta, {"b:2": "HTTP 400: shape mismatch"})
    failed: dict[str, str] = {}
    alive, why = asyncio.run(await_tensor_push(["a:1", "b:2"], meta, failed, timeout=10))
    assert (alive, why) == (["a:1"], None) and meta.targets == ["a:1", "b:2"]
    assert failed == {"b:2": "/update_weights_from_tensor: HTTP 400: shape mismatch"}


def test_a_trainer_that_fails_or_never_pushes_fails_the_update():
    meta = WeightUpdateMeta.tensor(4)
    trainer(meta, abort="WeightUploadError: gather failed")
    alive, why = asyncio.run(await_tensor_push(["a:1"], meta, {}, timeout=10))
    assert alive == [] and "gather failed" in why
    meta = WeightUpdateMeta.tensor(5)
    trainer(meta, {"*": "meta.targets was never set"})
    assert "never set" in asyncio.run(await_tensor_push(["a:1"], meta, {}, timeout=10))[1]
    t0 = time.monotonic()
    alive, why = asyncio.run(await_tensor_push(["a:1"], WeightUpdateMeta.tensor(6), {}, 0.2))
    assert "did not push the weights within" in why and time.monotonic() - t0 < 5

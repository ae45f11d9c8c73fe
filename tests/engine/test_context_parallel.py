"""Ulysses context parallelism (arealite.engine.context_parallel): two gloo ranks with cp = 2
against one process on the same rows, and four as dp = 2 x cp = 2; the model has one KV head, so
the KV heads are replicated across the ranks."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

from arealite.utils.network import find_free_port
from tests.support.cp_reference import batch, loss_and_grads, make_engine
from tests.support.procs import log_tail, spawn

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "support" / "cp_worker.py"


def _one_kv_head(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["num_key_value_heads"] = 1
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_bad_context_parallel_config_is_one_clear_error():
    from pydantic import ValidationError

    from arealite.api.config.actor import PPOActorConfig

    with pytest.raises(ValidationError, match="token_mean"):
        PPOActorConfig(context_parallel_size=2, loss_agg_mode="seq_mean_token_mean")
    with pytest.raises(ValidationError, match="shared_prompt_packing=false"):
        PPOActorConfig(context_parallel_size=2, group_size=4)
    with pytest.raises(ValidationError, match="attn_impl"):
        PPOActorConfig(context_parallel_size=2, attn_impl="sdpa")


def _run_ranks(model: Path, out: Path, world: int, cp: int) -> list[dict]:
    """``world`` gloo ranks of ``cp_worker`` (a data x context mesh); each rank's saved result."""
    port = find_free_port()
    ctxs = []
    for r in range(world):
        env = {
            "RANK": str(r),
            "LOCAL_RANK": str(r),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": str(ROOT),
        }
        cmd = [sys.executable, str(WORKER), "--model", str(model), "--out", str(out)]
        ctxs.append(spawn([*cmd, "--cp", str(cp)], env=env))
    procs = [c.__enter__() for c in ctxs]
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and any(p.poll() is None for p, _ in procs):
            if any(p.poll() not in (None, 0) for p, _ in procs):
                break
            time.sleep(0.2)
        codes = [p.poll() for p, _ in procs]
        if codes != [0] * world:
            pytest.fail(f"cp ranks: rc={codes}\n" + "\n".join(log_tail(log) for _, log in procs))
    finally:
        for c in ctxs:
            c.__exit__(None, None, None)
    return [torch.load(f"{out}.{r}") for r in range(world)]


@pytest.mark.integration
@pytest.mark.parametrize("world", [2, 4], ids=["dp1xcp2", "dp2xcp2"])
def test_cp2_equals_one_process(tiny_model_dir, tmp_path, world):
    """cp = 2 on 2 ranks, and dp = 2 x cp = 2 on 4 (two cp groups, each on its own rows, FSDP2
    over all four), against one process on the rows all ranks were given."""
    model = _one_kv_head(tiny_model_dir, tmp_path / "kv1")
    ranks = _run_ranks(model, tmp_path / "cp", world, cp=2)
    data = batch()
    n = data["input_ids"].shape[0] // world
    data = {k: v[: n * world] for k, v in data.items()}

    ref = make_engine(model, 1)
    loss, grads = loss_and_grads(ref, data, reduce=lambda t: None)
    logp = ref.forward(data)
    ref.destroy()
    assert all(abs(r["loss"] - loss) < 1e-6 for r in ranks), ([r["loss"] for r in ranks], loss)
    for got in (ranks[0]["grads"], ranks[-1]["grads"]):
        assert got.keys() == grads.keys() and len(grads) > 10
        for k, g in grads.items():
            err = float((got[k] - g).abs().max()) / max(float(g.abs().max()), 1e-12)
            assert err < 1e-5, (k, err)
    own = torch.cat([r["logp"] for r in ranks])  # each rank's own rows, in rank order
    assert own.shape == logp.shape and float((own - logp).abs().max()) < 1e-5

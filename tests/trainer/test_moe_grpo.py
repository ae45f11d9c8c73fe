"""The MoE short job: async GRPO on the tiny Qwen3-MoE with routing replay, through the
launcher (embedded server with --enable-return-routed-experts, weights broadcast each step,
requests cut by the pauses resumed), and its refusal of a dense model."""

from __future__ import annotations

import pytest

from arealite.demo.toy_math import write_toy_math
from arealite.launcher.local import main as launch
from benchmarks.harness.grpo_runs import launcher_cmd, metrics, small_run, wait_exit
from tests.support.procs import log_tail, spawn

STEPS = 2


@pytest.mark.integration
@pytest.mark.long
def test_moe_grpo_replays_the_servers_routing(tmp_path, tiny_moe_dir):
    data = tmp_path / "data"
    write_toy_math(data, n_train=40, n_valid=4, seed=0)
    over = [
        *small_run(tiny_moe_dir, data, STEPS, epochs=1),
        "actor.routing_replay=true",
        "rollout.max_head_offpolicyness=1",
    ]
    with spawn(launcher_cmd("configs/toy_grpo.yaml", tmp_path, "moe", over)) as (proc, log):
        code = wait_exit(proc, log, 240)
        assert code == 0, f"MoE run failed ({code}):\n{log_tail(log, 60)}"
    steps = [r for r in metrics(tmp_path, "moe") if r["step"] >= 1]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    first = steps[0]
    # Same weights, both sides fp32: the trainer's routers agree with the server's, and with
    # the server's experts replayed the log-probs agree as the dense model's do (invariant 8).
    assert first["moe/agreement"] >= 0.99
    assert first["logprob_agreement/max_abs_diff"] < 5e-5
    assert all("moe/max_load/layer0" in r and "moe/agreement/layer1" in r for r in steps)


@pytest.mark.parametrize("case", ["dense", "vllm-cpu"])
def test_routing_replay_without_experts_is_refused_before_anything_starts(
    tmp_path, tiny_model_dir, tiny_moe_dir, toy_data_dir, capsys, case
):
    model = tiny_model_dir if case == "dense" else tiny_moe_dir
    extra = ["launcher.server_backend=vllm", "servers.device=cpu"] if case == "vllm-cpu" else []
    code = launch(
        [
            "configs/toy_grpo.yaml",
            f"cluster.fileroot={tmp_path}",
            f"actor.path={model}",
            "actor.routing_replay=true",
            # data of its own: a clean clone has no outputs/assets (the dataset check comes first)
            f"train_dataset.path={toy_data_dir / 'train.jsonl'}",
            f"valid_dataset.path={toy_data_dir / 'valid.jsonl'}",
            *extra,
            "--dry-run",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "routing_replay" in err[0]
    want = "dense model" if case == "dense" else "embedded and sglang servers return them"
    assert want in err[0], err[0]
    assert not list(tmp_path.iterdir())  # nothing started, nothing written

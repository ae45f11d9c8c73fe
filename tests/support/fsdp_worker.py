"""One trainer rank for the multi-process FSDP tests (started once per rank with torchrun's
environment variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

Modes:
  train   run PPO steps on fixed global batches (each rank takes its share), optionally save a
          DCP checkpoint after step K; rank 0 writes losses and the final full parameters.
  resume  load a DCP checkpoint (model + optimizer + scheduler) and continue from step K.
  upload  push the weights to a group peer (tests/support/group_peer.py) by distributed broadcast,
          twice over the same group (one train step in between).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from arealite.api.config.actor import LoRAConfig, OptimizerConfig
from arealite.api.io_struct import FinetuneSpec, SaveLoadMeta, WeightUpdateMeta  # noqa: E402
from arealite.engine.functional import gather_logprobs  # noqa: E402
from arealite.engine.lora import gather_adapter  # noqa: E402
from arealite.engine.packing import split_batch_for_rank  # noqa: E402
from arealite.engine.ppo.actor import FSDPPPOActor  # noqa: E402
from arealite.utils.fsdp import full_state_dict  # noqa: E402
from tests.support.fsdp_helpers import actor_config, random_trajectories  # noqa: E402

GROUP = 2
GLOBAL_B = 8


def make_actor(model: str, lora: bool = False) -> FSDPPPOActor:
    opt = OptimizerConfig(lr=2e-3, lr_scheduler_type="linear", warmup_steps_proportion=0.3,
                          min_lr_ratio=0.1, gradient_clipping=1.0)
    # LoRA: B drawn at random too, so the adapter's gradients depend on both factors
    lcfg = LoRAConfig(rank=4, alpha=8.0, init_lora_weights=False) if lora else None
    cfg = actor_config(model, optimizer=opt, group_size=GROUP, group_reward_norm=True,
                       adv_norm=True, behav_imp_weight_cap=5.0, max_tokens_per_mb=40,
                       ppo_n_minibatches=1, lora=lcfg)
    actor = FSDPPPOActor(cfg, device="cpu", backend="gloo")
    actor.initialize(ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=40, train_batch_size=8))
    return actor


def step(actor: FSDPPPOActor, i: int) -> dict[str, float]:
    g = random_trajectories(GLOBAL_B, seed=100 + i, group_size=GROUP)
    noise = 0.1 * torch.randn(g["input_ids"].shape, generator=torch.Generator().manual_seed(i))
    g["noise"] = noise
    local = split_batch_for_rank(g, actor.rank, actor.world_size, group_size=GROUP)
    local["prox_logp"] = actor.compute_logp(local)
    # behaviour policy: slightly off the proximal one, as after an asynchronous rollout
    local["logprobs"] = torch.where(local["loss_mask"], local["prox_logp"] + local.pop("noise"), 0.0)
    actor.compute_advantages(local)
    return actor.ppo_update(local)


def nll(logits: torch.Tensor, mb: dict) -> torch.Tensor:
    lp = gather_logprobs(logits, mb["labels"])
    m = mb["loss_mask"].float()
    return -(lp * m).sum() / m.sum().clamp_min(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["train", "resume", "upload"], required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--start-step", type=int, default=0)
    ap.add_argument("--save-dcp")
    ap.add_argument("--save-after", type=int, default=0)
    ap.add_argument("--load-dcp")
    ap.add_argument("--master-port", type=int, default=0)
    ap.add_argument("--lora", action="store_true", help="train a LoRA adapter (PPO loss)")
    a = ap.parse_args()
    torch.manual_seed(0)
    actor = make_actor(a.model, a.lora)
    result: dict = {"world_size": actor.world_size}
    if a.mode == "resume":
        actor.load(SaveLoadMeta(path=a.load_dcp, weight_format="dcp", with_optim=True))
        result["lr_after_load"] = actor.optimizer.param_groups[0]["lr"]
    if a.mode in ("train", "resume"):
        stats = []
        for i in range(a.start_step, a.start_step + a.steps):
            stats.append(step(actor, i))
            if a.save_dcp and i + 1 == a.save_after:
                actor.save(SaveLoadMeta(path=a.save_dcp, weight_format="dcp", with_optim=True))
        result["stats"] = stats
    else:
        # uneven ranks first: rank 1 holds one short row, rank 0 six long ones; both must run
        # the same number of micro-batches (rank 1 pads with dummy rows) or FSDP would hang
        skew = random_trajectories(6 if actor.rank == 0 else 1, seed=50 + actor.rank,
                                   min_len=20, max_len=30)
        n_mbs = torch.tensor([len(actor.split_micro_batches(skew))])
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(actor.world_size)]
        torch.distributed.all_gather(counts, n_mbs)
        result["mb_counts"] = [int(c) for c in counts]
        result["skew_stats"] = actor.train_batch(skew, nll, lambda mb: mb["loss_mask"].sum())
        params = []
        for v in (1, 2):
            meta = WeightUpdateMeta(type="distributed", version=v, master_port=a.master_port,
                                    group_name="wu_fsdp", timeout=60)
            meta.param_specs = actor.get_param_specs(bucket_size_mb=0.05)
            meta.world_size = 2  # one peer with tp 1 (the client sets this from /server_info)
            actor.upload_weights(meta)
            params.append(full_state_dict(actor.model))
            if v == 1:
                step(actor, 0)
        result["uploaded"] = params
        result["n_buckets"] = len(meta.param_specs)
    sd = gather_adapter(actor.model) if a.lora else full_state_dict(actor.model)
    if actor.rank == 0:
        result["params"] = sd
        torch.save(result, a.out)
    # both ranks done before either tears its group down: a rank leaving while the other
    # still talks to it ends in gloo's "terminate called without an active exception"
    torch.distributed.barrier()
    actor.destroy()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

"""The engines of one RL run (``trainer/grpo.py``), and the phases of a step over them.

Built once, in the same order on every rank (the FSDP initializations and the broadcast port
are collectives): the data, the rollout client (staleness-gated), an evaluation client (no
gate), the actor, then the optional reference model, critic and reward-model pool, the
workflows, the weight-update channel and the per-step switches (dynamic sampling, co-located
phases). One version clock per rank: the rollout client's, shared by the other two.

A step: ``rollout_batch`` -> ``prepare_logp_and_advantages`` -> ``ppo_update`` ->
``sync_weights`` (-> ``gate_after_push``), timed as ``timeperf/rollout_wait``, ``logp``,
``update``, ``weight_sync`` (, ``consistency_gate``).
Async (``prepare_batch``, trajectories at most ``max_head_offpolicyness`` versions old) and sync
(``rollout_batch``) differ in the rollout phase only; ``launcher.colocate`` adds the switches of
``trainer/colocate.py`` around the phases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arealite.api.config.experiment import GRPOConfig
from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.io_struct import FinetuneSpec
from arealite.api.workflow_api import RolloutWorkflow
from arealite.api.workflow_factory import build_workflow
from arealite.backends.base import GenerateProtocol
from arealite.backends.registry import protocol_for, servers_on_cpu
from arealite.dataset.loader import create_dataloader, load_rows
from arealite.engine.ppo.actor import FSDPPPOActor
from arealite.engine.ppo.critic import FSDPPPOCritic
from arealite.engine.vision_processor import vision_processor
from arealite.observe import stats_tracker
from arealite.observe.timing import timer
from arealite.rollout.data_cycle import DataCycle
from arealite.rollout.dynamic_sampling import GroupRewardFilter, rollout_full_batch
from arealite.rollout.remote_engine import RemoteInferenceEngine
from arealite.rollout.reward_model_client import RemoteRewardModelEngine
from arealite.trainer.colocate import ColocatedPhases
from arealite.trainer.common import load_tokenizer
from arealite.trainer.consistency_probes import build_gate
from arealite.trainer.eval_hook import EvalFn, load_eval_fn, run_evaluation
from arealite.weights.consistency_gate import ConsistencyGate
from arealite.weights.push import WeightPushPlan, push_weights


@dataclass
class RLEngines:
    config: GRPOConfig
    rank: int
    world: int
    tokenizer: Any
    processor: Any  # a vision-language model's (its workflows and HF checkpoints need it), or None
    # data: each rank takes its shard of every global batch
    loader: Any
    valid_rows: list[dict[str, Any]]
    ft: FinetuneSpec
    cycle: DataCycle  # sync mode's walk over the loader; async mode's is the executor's
    rollout: RemoteInferenceEngine
    eval_rollout: RemoteInferenceEngine
    actor: FSDPPPOActor
    ref: FSDPPPOActor | None
    critic: FSDPPPOCritic | None  # PPO with a learned baseline: GAE over its values
    reward_model: RemoteRewardModelEngine | None  # the training workflow scores through it
    workflow: RolloutWorkflow
    eval_workflow: RolloutWorkflow
    eval_fn: EvalFn | None
    # weight updates: the run's one transport (a disk folder per version, one broadcast group
    # for the whole run, ...), chosen from the config and the backend
    pushes: WeightPushPlan
    keep: GroupRewardFilter | None  # DAPO dynamic sampling: equal-reward groups dropped
    colocated: ColocatedPhases | None  # launcher.colocate: servers and trainer take turns
    # weight_update.consistency: the servers' next-token distributions against the actor's
    gate: ConsistencyGate | None = None
    sample_workflow: RolloutWorkflow | None = None  # evaluator.pass_k: pass_n sampled replies a row

    @property
    def total_steps(self) -> int:
        return self.ft.total_train_steps  # also the lr schedule's length

    def data_state(self) -> dict[str, Any]:
        """The data position beyond the loader's: the epoch and, in async mode, the rows in
        flight (the loader is past them); in sync mode the walk's, with the executor's drops
        and counters beside it (``executor``)."""
        if self.config.async_training:
            return self.rollout.data_state()
        return {**self.cycle.state_dict(), "executor": self.rollout.data_state()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        if self.config.async_training:
            self.rollout.load_data_state(state)
        else:
            self.cycle.load_state_dict(state)
            self.rollout.load_data_state(state.get("executor", {}))

    def start(self) -> None:
        """The clients connect to their servers (after a restore: it sets their version)."""
        self.rollout.initialize(None, train_data_parallel_size=self.world)
        self.eval_rollout.initialize(None, train_data_parallel_size=1)
        if self.reward_model is not None:
            self.reward_model.initialize()

    def evaluate(self, version: int) -> dict[str, float]:
        """Held-out evaluation; drains the training rollout first (collective)."""
        context = {"tokenizer": self.tokenizer, "version": version, "config": self.config}
        return run_evaluation(self.rollout, self.eval_rollout, self.eval_workflow, self.valid_rows,
                              self.config.evaluator, self.eval_fn, context, self.rank == 0,
                              sample_workflow=self.sample_workflow)

    def destroy(self) -> None:
        for engine in (self.rollout, self.eval_rollout, self.actor,
                       *(e for e in (self.reward_model, self.critic) if e is not None)):
            engine.destroy()


def build_rl_engines(config: GRPOConfig, rank: int, world: int) -> RLEngines:
    tokenizer = load_tokenizer(config.tokenizer_path or config.actor.path)
    train_rows = load_rows(config.train_dataset)
    valid_rows = load_rows(config.valid_dataset) if config.valid_dataset else []
    loader = create_dataloader(train_rows, config.train_dataset, config.seed, rank, world)
    ft = FinetuneSpec(config.total_train_epochs, len(train_rows), config.train_dataset.batch_size,
                      config.total_train_steps)
    # The client speaks the servers' protocol (launcher.server_backend: SGLang's or vLLM's).
    protocol = protocol_for(config.launcher.server_backend)
    rollout = RemoteInferenceEngine(config.rollout, protocol=protocol)
    eval_rollout = RemoteInferenceEngine(eval_rollout_config(config, len(valid_rows)), rollout.clock, protocol)
    eval_rollout.adapters = rollout.adapters  # a LoRA run evaluates its current adapter
    actor = FSDPPPOActor(config.actor, config.device, config.dist_backend, config.seed, rollout.clock)
    actor.initialize(None, ft)
    if actor.routing is not None:  # every answer must carry this many expert ids per token
        rollout.routed_experts_width = actor.routing.width
    ref = None
    if config.ref is not None:
        ref = FSDPPPOActor(config.ref, config.device, config.dist_backend, config.seed)
        ref.initialize(None, None)
    critic = None
    if config.critic is not None:
        critic = FSDPPPOCritic(config.critic.model_copy(update={"path": config.critic.path or config.actor.path}),
                               config.device, config.dist_backend, config.seed)
        critic.initialize(None, ft)
    rm = RemoteRewardModelEngine(config.reward_model) if config.reward_model else None
    processor = vision_processor(config.actor.path)
    extra = {"processor": processor} if processor is not None else {}
    rm_kw = {"reward_model": rm} if rm is not None else {}
    workflow = build_workflow(config.workflow, config.gconfig, tokenizer, **extra, **rm_kw)
    # evaluation keeps the rule reward alone: the held-out figures stay the verifiable ones
    eval_workflow = build_workflow(config.workflow, eval_generation(config), tokenizer, **extra)
    eval_fn = load_eval_fn(config.evaluator.eval_fn)
    ev = config.evaluator
    sample_workflow = None if not ev.pass_k or eval_fn is not None else build_workflow(
        config.workflow, config.gconfig.new(n_samples=ev.pass_n or ev.pass_k), tokenizer, **extra)
    return RLEngines(
        config, rank, world, tokenizer, processor, loader, valid_rows, ft, DataCycle(),
        rollout, eval_rollout, actor, ref, critic, rm, workflow, eval_workflow, eval_fn,
        _weight_pushes(config, protocol, rank),
        keep=GroupRewardFilter() if config.actor.dynamic_sampling else None,
        colocated=_colocated_phases(config, rollout, actor, ref, rm, rank),
        gate=build_gate(config, workflow, valid_rows or train_rows, rank,
                        rollout.keys.api_headers, vision=processor is not None),
        sample_workflow=sample_workflow)


def eval_generation(config: GRPOConfig) -> GenerationHyperparameters:
    """How the evaluation generates: ``eval_gconfig``, else one greedy sample per prompt."""
    return config.eval_gconfig or config.gconfig.new(
        n_samples=1, greedy=True, temperature=0.0, return_routed_experts=False)


def eval_rollout_config(config: GRPOConfig, n_rows: int) -> InferenceEngineConfig:
    """The evaluation client's settings: no staleness bound (it only evaluates the current
    weights), and ``evaluator.max_concurrent`` episodes in flight, by default every held-out
    prompt at once. (Left to the training client's ``max_concurrent_rollouts`` default, the
    consumer batch size, 200 prompts ran 4 at a time: a batch of 4 rows on the server.)"""
    ev = config.evaluator
    episodes = min(n_rows, ev.max_prompts or n_rows)  # one per held-out prompt
    return config.rollout.model_copy(update={"max_head_offpolicyness": 1 << 20,
                                             "max_concurrent_rollouts": ev.max_concurrent or max(1, episodes)})


def _weight_pushes(config: GRPOConfig, protocol: GenerateProtocol, rank: int) -> WeightPushPlan:
    """The transport the servers can receive, and the broadcast group's port (rank 0's)."""
    # from the config alone: this process's CUDA_VISIBLE_DEVICES names the trainer's GPUs
    on_gpu = not servers_on_cpu(config.servers.device, config.launcher.gpus_per_server, {})
    return WeightPushPlan.choose(config.weight_update, config.actor.lora is not None, protocol,
                                 on_gpu, config.run_dir("weights"), rank)


def _colocated_phases(config: GRPOConfig, rollout: RemoteInferenceEngine, actor: FSDPPPOActor,
                      ref: FSDPPPOActor | None, rm: RemoteRewardModelEngine | None,
                      rank: int) -> ColocatedPhases | None:
    """launcher.colocate: servers and trainer take turns with the host's memory (sync mode);
    the reward-model pool takes turns too, unless the launcher gave it GPUs of its own."""
    if not config.launcher.colocate:
        return None
    own_gpus = config.launcher.reward_model_servers is not None and config.launcher.gpus_per_server
    return ColocatedPhases(rollout, actor, ref, rank, reward_model=None if own_gpus else rm,
                           recreate=config.launcher.colocate_servers == "recreate",
                           start_timeout=config.launcher.startup_timeout + 60)


def rollout_batch(e: RLEngines) -> dict[str, Any]:
    """The step's trajectories: async ``prepare_batch`` (from the executor's queue), or sync
    ``rollout_batch`` (with dynamic sampling: drawn until the batch is full)."""
    if e.colocated is not None:  # co-located: the accelerator goes to the servers
        e.colocated.offload_actor()
    with timer("rollout_wait"):
        if e.config.async_training:
            batch = e.rollout.prepare_batch(e.loader, e.workflow, should_accept=e.keep)
        elif e.keep is not None:
            batch = rollout_full_batch(
                lambda rows, accept: e.rollout.rollout_batch(rows, e.workflow, accept),
                lambda: e.cycle.next_rows(e.loader), e.keep,
                e.config.rollout.consumer_batch_size, e.config.actor.group_size)
        else:
            batch = e.rollout.rollout_batch(e.cycle.next_rows(e.loader), e.workflow)
    if e.colocated is not None:  # ... and back to the trainer
        e.colocated.release()
    return batch


def prepare_logp_and_advantages(e: RLEngines, batch: dict[str, Any]) -> None:
    """Recomputed log-probabilities, the reference model's, the critic's values, advantages."""
    with timer("logp"):
        e.actor.prepare_prox_logp(batch)  # fused into the update when it can be
        if e.ref is not None:
            batch["ref_logp"] = (e.colocated.ref_logp(batch) if e.colocated is not None
                                 else e.ref.compute_logp(batch))
        if e.critic is not None:
            batch["values"] = e.critic.compute_values(batch)
        e.actor.compute_advantages(batch)


def ppo_update(e: RLEngines, batch: dict[str, Any]) -> dict[str, float]:
    with timer("update"):
        stats = e.actor.ppo_update(batch)
        if e.critic is not None:  # trained on the returns
            stats.update(e.critic.ppo_update(batch))
    return stats


def sync_weights(e: RLEngines, version: int) -> None:
    """Pause the rollout, push the new weights as ``version``, resume."""
    with timer("weight_sync"):
        if e.colocated is not None:  # the servers get their memory back first
            e.colocated.resume()
        e.rollout.pause()
        push_to_servers(e, version)
        e.rollout.resume()


def gate_after_push(e: RLEngines, version: int) -> None:
    """The consistency gate, when it is due after this push (every ``consistency_gate.every``
    pushes): a phase of its own, timed apart from the push as ``timeperf/consistency_gate``."""
    if e.gate is not None and e.gate.due_after_push():
        check_consistency(e, version)


def push_to_servers(e: RLEngines, version: int) -> None:
    """The servers to the actor's weights as ``version`` (every rank; collective)."""
    push_weights(e.actor, e.rollout, e.pushes.meta(version, e.actor), e.rank,
                 e.pushes.wu.timeout, e.pushes.wu.retries)


def check_consistency(e: RLEngines, version: int) -> None:
    """The gate over the healthy servers (collective); its figures (the worst server's) go to
    the step's stats as ``consistency/*`` (the largest of the checks since the last step)."""
    assert e.gate is not None
    addrs = e.rollout.pool.healthy_addrs() if e.rank == 0 and e.rollout.pool is not None else []
    with timer("consistency_gate"):
        res = e.gate.check(e.actor, addrs, version)
    worst = res.worst()
    if worst:
        with stats_tracker.scope("consistency"):
            stats_tracker.scalar(stats_tracker.ReduceType.MAX, **worst)

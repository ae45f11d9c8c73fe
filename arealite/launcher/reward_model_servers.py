"""The reward-model server pool a launcher starts beside the generation servers
(``launcher.reward_model_servers``): one ``launch_server --is-embedding`` process per server, its
own model, count and threads; the trainer's ``reward_model`` client finds them in
``AREAL_RM_SERVER_ADDRS``. Pure functions of the config, as ``plan`` is."""

from __future__ import annotations

import os
import sys

from arealite.api.config.experiment import BaseExperimentConfig, GRPOConfig
from arealite.api.config.launcher import RewardModelServersConfig
from arealite.api.reward_model_api import RM_ADDRS_ENV
from arealite.launcher import plan
from arealite.launcher.plan import LaunchError, ProcSpec
from arealite.utils import keys

NAME_PREFIX = "rm_server"
# the reward-model pool's backend -> the module run as `python -m MODULE` (the same flags)
MODULES = {"embedded": "servers.launch_server", "sglang": "sglang.launch_server"}


def rm_servers_config(config: BaseExperimentConfig) -> RewardModelServersConfig | None:
    return getattr(plan.launcher_config(config), "reward_model_servers", None)


def n_rm_servers(config: BaseExperimentConfig, mode: str) -> int:
    """Reward-model servers this launcher starts in ``mode`` (none in trainer_only)."""
    rc = rm_servers_config(config)
    return rc.n_servers if rc is not None and mode in ("local", "server_only") else 0


def is_rm_server(name: str) -> bool:
    return name.startswith(NAME_PREFIX)


def rm_server_specs(config: GRPOConfig, ports: list[int], first_gpu: int = 0,
                    environ: dict[str, str] | None = None) -> list[ProcSpec]:
    """One scoring server per port. ``first_gpu``: where this pool's GPUs start (after the
    generation servers') when the launcher hands out GPUs (``launcher.gpus_per_server``)."""
    environ = os.environ if environ is None else environ
    rc, lc = config.launcher.reward_model_servers, config.launcher
    if rc is None:
        return []
    if config.reward_model is not None and config.reward_model.server_addrs:
        raise LaunchError("launcher.reward_model_servers starts the reward-model pool, but "
                          "reward_model.server_addrs names other servers: drop one of the two")
    module = MODULES[rc.backend]
    secrets = plan.run_keys(config, environ)
    specs = []
    for i, port in enumerate(ports):
        cmd = [sys.executable, "-m", module, "--model-path", rc.model_path, "--is-embedding",
               "--host", lc.server_host, "--port", str(port), "--dtype", rc.dtype,
               "--log-level", config.servers.log_level]
        if rc.backend == "sglang":  # real SGLang reads keys only from its flags (masked)
            for flag, env_name in (("--api-key", keys.API_KEY_ENV),
                                   ("--admin-api-key", keys.ADMIN_API_KEY_ENV)):
                if env_name in secrets:
                    cmd += [flag, secrets[env_name]]
        cmd += list(rc.extra_args)
        env = {"OMP_NUM_THREADS": str(rc.threads), "PYTHONUNBUFFERED": "1", **secrets}
        if lc.gpus_per_server:
            env["CUDA_VISIBLE_DEVICES"] = plan.device_ids(
                first_gpu + i * lc.gpus_per_server, lc.gpus_per_server, environ)
        specs.append(ProcSpec(f"{NAME_PREFIX}{i}", cmd, env,
                              addr=f"{plan.advertised_host(lc.server_host)}:{port}"))
    return specs


def addrs_line(specs: list[ProcSpec]) -> str:
    """``AREAL_RM_SERVER_ADDRS=h:p,...``: what a trainer_only run elsewhere needs."""
    return f"{RM_ADDRS_ENV}={','.join(s.addr or '' for s in specs)}"


def with_rm_addrs(trainer: ProcSpec, addrs: list[str]) -> ProcSpec:
    """The trainer's spec with the reward-model pool's addresses in its environment."""
    if not addrs:
        return trainer
    return ProcSpec(trainer.name, trainer.cmd, {**trainer.env, RM_ADDRS_ENV: ",".join(addrs)},
                    trainer.addr)

"""What the launchers start: the exact command line and extra environment of every process.

Pure functions of the config (no process is started here), shared by the local launcher, its
``--dry-run`` and the Ray launcher, so what a dry run prints is what a real run executes.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from arealite.api.config.experiment import BaseExperimentConfig, GRPOConfig
from arealite.api.config.launcher import LauncherConfig
from arealite.api.config.loader import SECRET_FIELDS
from arealite.backends.registry import servers_on_cpu
from arealite.backends.vllm import server_command as vllm_server
from arealite.utils import keys, network

ADDRS_ENV = "AREAL_LLM_SERVER_ADDRS"
# set for the trainers a launcher starts: it has decided on the run folder (run_folder.claim);
# a trainer started by hand (torchrun -m arealite.trainer.grpo) decides itself
CLAIMED_ENV = "AREALITE_RUN_FOLDER_CLAIMED"
SECRET_FLAGS = ("--api-key", "--admin-api-key")
# launcher.server_backend -> the module run as `python -m MODULE` (same flags for the first
# two; vLLM's command is backends/vllm/server_command.py's, from its own virtualenv).
SERVER_MODULES = {"embedded": "servers.launch_server", "sglang": "sglang.launch_server",
                  "vllm": vllm_server.VLLM_MODULE}


class LaunchError(ValueError):
    """The config cannot be launched as asked (the message says why); exit status 2."""


@dataclass
class ProcSpec:
    """One process to start: ``cmd`` with ``env`` set on top of the launcher's environment."""

    name: str
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    addr: str | None = None  # host:port a server answers on

    def shell(self, mask_secrets: bool = True) -> str:
        """The command as one shell line, ``VAR=value ... cmd``, secrets masked by default."""
        cmd = list(self.cmd)
        if mask_secrets:
            for i, a in enumerate(cmd[:-1]):
                if a in SECRET_FLAGS:
                    cmd[i + 1] = "***"
        env = " ".join(
            f"{k}={'***' if mask_secrets and k in keys.SECRET_ENV else shlex.quote(v)}"
            for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(cmd)


def log_dir(config: BaseExperimentConfig) -> Path:
    return config.run_dir("logs")


def launcher_config(config: BaseExperimentConfig) -> LauncherConfig:
    return getattr(config, "launcher", None) or LauncherConfig()


def entry_module(config: BaseExperimentConfig) -> str:
    """The trainer module: ``launcher.entry_module`` or ``arealite.trainer.<kind>``."""
    return launcher_config(config).entry_module or f"arealite.trainer.{config.kind}"


def parse_addrs(text: str | list[str], source: str) -> list[str]:
    """``network.parse_addrs`` with its error as a ``LaunchError`` (exit status 2)."""
    try:
        return network.parse_addrs(text, source)
    except ValueError as e:
        raise LaunchError(str(e)) from None


def trainer_addrs(config: BaseExperimentConfig, environ: dict[str, str] | None = None) -> list[str]:
    """Server addresses for ``trainer_only``: ``rollout.server_addrs``, else the env var."""
    environ = os.environ if environ is None else environ
    rollout = getattr(config, "rollout", None)
    if rollout is not None and rollout.server_addrs:
        return parse_addrs(rollout.server_addrs, "rollout.server_addrs")
    addrs = parse_addrs(environ.get(ADDRS_ENV, ""), ADDRS_ENV)
    if not addrs:
        raise LaunchError(
            f"launcher.mode=trainer_only needs server addresses: set rollout.server_addrs "
            f"or {ADDRS_ENV}=host:port,..."
        )
    return addrs


def device_ids(start: int, count: int, environ: dict[str, str]) -> str:
    """GPU ids ``start .. start+count-1``, mapped through an inherited CUDA_VISIBLE_DEVICES
    (e.g. Slurm's) so a launcher given GPUs 4-7 hands out 4-7, not 0-3."""
    parent = environ.get("CUDA_VISIBLE_DEVICES")
    if parent is None or parent.strip() == "":
        return ",".join(str(i) for i in range(start, start + count))
    visible = [x.strip() for x in parent.split(",") if x.strip()]
    if start + count > len(visible):
        raise LaunchError(
            f"need GPUs {start}..{start + count - 1} but CUDA_VISIBLE_DEVICES={parent} "
            f"has {len(visible)}"
        )
    return ",".join(visible[start:start + count])


def run_keys(config: BaseExperimentConfig, environ: dict[str, str] | None = None,
             section: str = "servers") -> dict[str, str]:
    """The run's keys as environment variables (``AREALITE_API_KEY`` ...): the servers'
    ``servers.api_key`` / ``servers.admin_api_key`` (for the trainer, ``rollout.*`` first) when
    set, else the launcher's own environment. Servers and trainer get them in their environment,
    never on a command line."""
    sections = [getattr(config, n, None) for n in (("rollout", "servers") if section == "rollout"
                                                   else ("servers",))]
    out = {}
    for env_name, field_name in ((keys.API_KEY_ENV, "api_key"),
                                 (keys.ADMIN_API_KEY_ENV, "admin_api_key")):
        value = next((getattr(x, field_name) for x in sections if getattr(x, field_name, None)),
                     None)
        v = keys.resolve(value, env_name, environ)
        if v:
            out[env_name] = v
    return out


def advertised_host(bind_host: str) -> str:
    """The address other processes use to reach a server bound to ``bind_host``."""
    if bind_host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return bind_host


def server_specs(
    config: GRPOConfig, ports: list[int], environ: dict[str, str] | None = None
) -> list[ProcSpec]:
    """One ``launch_server`` process per port: embedded (``servers.launch_server``) or real
    SGLang (``sglang.launch_server``) with the same flags. Server ``i`` gets
    ``--random-seed servers.random_seed + i`` so servers given the same prompt do not sample the
    same tokens, and ``--weight-version 0`` (the trainer's initial version)."""
    environ = os.environ if environ is None else environ
    lc, sg = config.launcher, config.servers
    model_path = sg.model_path or config.actor.path
    if not model_path:
        raise LaunchError("no model to serve: set servers.model_path or actor.path")
    if lc.colocate_servers == "recreate" and not lc.colocate:
        raise LaunchError("launcher.colocate_servers=recreate is a co-located mode option: set "
                          "launcher.colocate=true")
    if lc.colocate and lc.gpus_per_server > 1:
        raise LaunchError("launcher.colocate puts server i on trainer rank i's GPU: set "
                          "launcher.gpus_per_server to 1 (or 0 on CPU)")
    if lc.gpus_per_server and sg.tp_size > lc.gpus_per_server:
        raise LaunchError(f"servers.tp_size={sg.tp_size} needs gpus_per_server >= {sg.tp_size}")
    module = SERVER_MODULES[lc.server_backend]
    host = lc.server_host
    if lc.server_backend == "vllm":
        return _vllm_specs(config, str(model_path), ports, environ)
    specs = []
    for i, port in enumerate(ports):
        cmd = [sys.executable, "-m", module, "--model-path", str(model_path),
               "--host", host, "--port", str(port), "--weight-version", "0",
               "--dtype", sg.dtype, "--log-level", sg.log_level]
        if sg.random_seed is not None:
            cmd += ["--random-seed", str(sg.random_seed + i)]
        if sg.device != "auto":
            cmd += ["--device", sg.device]
        for flag, value in (("--max-running-requests", sg.max_running_requests),
                            ("--context-length", sg.context_length),
                            ("--mem-fraction-static", sg.mem_fraction_static)):
            if value is not None:
                cmd += [flag, str(value)]
        secrets = run_keys(config, environ)
        if lc.server_backend == "sglang":
            # real SGLang reads keys only from its flags (masked in every printed command line)
            for flag, env_name in (("--api-key", keys.API_KEY_ENV),
                                   ("--admin-api-key", keys.ADMIN_API_KEY_ENV)):
                if env_name in secrets:
                    cmd += [flag, secrets[env_name]]
        if sg.tp_size != 1:
            cmd += ["--tp-size", str(sg.tp_size)]
        if sg.skip_tokenizer_init:
            cmd.append("--skip-tokenizer-init")
        if sg.enable_metrics:
            cmd.append("--enable-metrics")
        if sg.enable_return_routed_experts:
            cmd.append("--enable-return-routed-experts")
        if lc.server_backend == "embedded":  # the run's own folder: weight updates, checkpoints
            cmd += ["--weight-load-root", str(config.run_dir())]
        cmd += lora_server_flags(config)
        cmd += list(sg.extra_args)
        specs.append(ProcSpec(f"server{i}", cmd, _server_env(lc, i, secrets, environ),
                              addr=f"{advertised_host(host)}:{port}"))
    return specs


def lora_server_flags(config: GRPOConfig) -> list[str]:
    """A LoRA run's servers load its adapters at run time (SGLang's flags; real SGLang needs
    the rank and target modules up front); one batch slot per version within the staleness
    bound, plus the evaluation's."""
    lora = config.actor.lora
    if lora is None:
        return []
    per_batch = max(8, config.rollout.max_head_offpolicyness + 2)
    return ["--enable-lora", "--max-lora-rank", str(lora.rank), "--max-loras-per-batch",
            str(per_batch), "--lora-target-modules", *lora.target_modules]


def _server_env(lc: LauncherConfig, i: int, secrets: dict[str, str],
                environ: dict[str, str]) -> dict[str, str]:
    env = {"OMP_NUM_THREADS": str(thread_counts(lc)[0]), "PYTHONUNBUFFERED": "1", **secrets}
    if lc.gpus_per_server:
        env["CUDA_VISIBLE_DEVICES"] = device_ids(i * lc.gpus_per_server, lc.gpus_per_server,
                                                  environ)
    return env


def _vllm_specs(config: GRPOConfig, model_path: str, ports: list[int],
                environ: dict[str, str]) -> list[ProcSpec]:
    """vLLM servers (``vllm_server.vllm_command``); a model vLLM cannot train with is a
    ``LaunchError`` here rather than a failure at the first request or update."""
    lc, sg = config.launcher, config.servers
    cpu = servers_on_cpu(sg.device, lc.gpus_per_server, environ)
    problems = vllm_server.model_problems(model_path, cpu) + vllm_server.routed_experts_problems(sg, cpu)
    if problems:
        raise LaunchError("launcher.server_backend=vllm: " + "; ".join(problems))
    secrets = run_keys(config, environ)
    specs = []
    for i, port in enumerate(ports):
        seed = None if sg.random_seed is None else sg.random_seed + i
        cmd, extra = vllm_server.vllm_command(model_path, lc.server_host, port, sg, seed, cpu,
                                              secrets.get(keys.API_KEY_ENV), environ)
        flags, lora_env = vllm_server.lora_flags(config.actor.lora,
                                                 config.rollout.max_head_offpolicyness)
        cut = len(cmd) - len(sg.extra_args)  # the user's extra args stay last
        cmd = cmd[:cut] + flags + cmd[cut:]
        env = {**_server_env(lc, i, secrets, environ), **extra, **lora_env}
        specs.append(ProcSpec(f"server{i}", cmd, env,
                              addr=f"{advertised_host(lc.server_host)}:{port}"))
    return specs


def _is_key_override(override: str) -> bool:
    return override.split("=", 1)[0].rsplit(".", 1)[-1] in SECRET_FIELDS


def thread_counts(lc: LauncherConfig, cores: int | None = None) -> tuple[int, int]:
    """(threads per server, threads per trainer rank). A 0 in the config is auto: servers get
    an even share of the cores (each server and rank counts once), the trainer ranks split what
    the servers leave; at least 1 each. On GPUs the threads only feed the host side."""
    if cores is None:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
    here_servers = 0 if lc.mode == "trainer_only" else lc.n_servers
    here_ranks = 0 if lc.mode == "server_only" else lc.trainer_nproc
    server = lc.server_threads or max(1, cores // max(1, here_servers + here_ranks))
    left = cores - server * here_servers
    trainer = lc.trainer_threads or max(1, left // max(1, here_ranks))
    return server, trainer


def torchrun_prefix() -> list[str]:
    """``torchrun`` of this interpreter's environment (or ``python -m torch.distributed.run``)."""
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "torch.distributed.run"]


def trainer_spec(
    config: BaseExperimentConfig,
    config_path: str,
    overrides: list[str],
    master_port: int,
    server_addrs: list[str] | None,
    gpu_offset: int | None = None,
    environ: dict[str, str] | None = None,
) -> ProcSpec:
    """``torchrun --nproc-per-node K ... -m <entry> CONFIG overrides`` with the addresses in
    ``AREAL_LLM_SERVER_ADDRS``. ``gpu_offset``: first GPU (after the servers') when the
    launcher hands out GPUs; None leaves CUDA_VISIBLE_DEVICES as inherited."""
    environ = os.environ if environ is None else environ
    lc = launcher_config(config)
    # key overrides travel in the environment (below), not on the trainer's command line
    overrides = [o for o in overrides if not _is_key_override(o)]
    cmd = [*torchrun_prefix(), "--nnodes", "1", "--nproc-per-node", str(lc.trainer_nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(master_port),
           "-m", entry_module(config), str(config_path), *overrides]
    env = {"OMP_NUM_THREADS": str(thread_counts(lc)[1]), "PYTHONUNBUFFERED": "1",
           "TOKENIZERS_PARALLELISM": "false", CLAIMED_ENV: "1",
           **run_keys(config, environ, "rollout")}
    if server_addrs:
        env[ADDRS_ENV] = ",".join(server_addrs)
    if gpu_offset is not None:
        env["CUDA_VISIBLE_DEVICES"] = device_ids(gpu_offset, lc.trainer_nproc, environ)
    return ProcSpec("trainer", cmd, env)


def uses_servers(config: BaseExperimentConfig) -> bool:
    return isinstance(config, GRPOConfig)


def trainer_gpu_offset(config: BaseExperimentConfig, n_servers_started: int) -> int | None:
    """GPUs go to servers first, then to the trainer, when the launcher assigns GPUs at all;
    co-located (``launcher.colocate``), trainer rank i shares server i's first GPU."""
    lc = launcher_config(config)
    if lc.gpus_per_server and n_servers_started and getattr(lc, "colocate", False):
        return 0
    if lc.gpus_per_server and n_servers_started:
        return n_servers_started * lc.gpus_per_server
    return None

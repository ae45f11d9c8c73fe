"""Place the servers and the trainer on a Ray cluster (optional; needs ``pip install ray``).

``python -m arealite.launcher.ray CONFIG [key=value ...] [--address ray://... | auto]``

Each server runs in a Ray actor holding ``launcher.gpus_per_server`` GPUs (Ray sets
``CUDA_VISIBLE_DEVICES``); it binds the node's IP on a port free on that node and reports
``ip:port``. The trainer (``torchrun --nproc-per-node launcher.trainer_nproc``) runs in one actor
holding ``trainer_nproc`` GPUs, with the addresses in ``AREAL_LLM_SERVER_ADDRS``. The commands are
the ones ``arealite train --dry-run`` prints (``arealite.launcher.plan``); only placement differs.
A server or trainer that fails stops everything, as in the local launcher. Multi-node trainers
(torchrun over several nodes) are out of scope here; use the Slurm templates in ``deploy/``.
"""

from __future__ import annotations

import argparse
import sys
import time

from arealite.api.config import GRPOConfig
from arealite.api.config_loader import ConfigError, load_config
from arealite.launcher import plan
from arealite.launcher.plan import LaunchError, ProcSpec


def _require_ray():
    try:
        import ray
    except ImportError:
        raise LaunchError(
            "the Ray launcher needs ray: pip install 'arealite[ray]' (or use `arealite train` "
            "for one machine, or the Slurm templates in deploy/slurm)"
        ) from None
    return ray


class _ProcHost:
    """Body of the Ray actor that owns one child process (and its descendants) on its node."""

    def __init__(self, spec: ProcSpec, log_dir: str, is_server: bool) -> None:
        from pathlib import Path

        import ray

        from arealite.launcher.supervisor import Console, ManagedProcess
        from arealite.utils.network import find_free_port

        ip = ray.util.get_node_ip_address()
        cmd = list(spec.cmd)
        addr = None
        if is_server:  # ports are only known to be free on the node that binds them
            port = find_free_port(ip)
            cmd[cmd.index("--host") + 1] = ip
            cmd[cmd.index("--port") + 1] = str(port)
            addr = f"{ip}:{port}"
        else:
            cmd[cmd.index("--master-port") + 1] = str(find_free_port())
        # Ray already set CUDA_VISIBLE_DEVICES for the GPUs this actor holds.
        env = {k: v for k, v in spec.env.items() if k != "CUDA_VISIBLE_DEVICES"}
        self.proc = ManagedProcess(ProcSpec(spec.name, cmd, env, addr), Path(log_dir), Console())
        self.proc.start()

    def addr(self) -> str | None:
        return self.proc.spec.addr

    def poll(self) -> int | None:
        self.proc.refresh_descendants()
        return self.proc.poll()

    def tail(self) -> list[str]:
        return self.proc.tail()

    def stop(self, grace: float) -> None:
        self.proc.stop(grace)


def run(config: GRPOConfig, config_path: str, overrides: list[str], address: str | None) -> int:
    ray = _require_ray()
    from arealite.launcher.local import _health_ok

    lc = config.launcher
    log_dir = str(plan.log_dir(config))
    ray.init(address=address)
    host_cls = ray.remote(_ProcHost)
    hosts: list = []
    try:
        for spec in plan.server_specs(config, [0] * lc.n_servers):
            opts = {"num_cpus": plan.thread_counts(lc)[0], "num_gpus": lc.gpus_per_server}
            hosts.append(host_cls.options(**opts).remote(spec, log_dir, True))
        addrs = ray.get([h.addr.remote() for h in hosts])
        deadline = time.monotonic() + lc.startup_timeout
        while not all(_health_ok(a) for a in addrs):
            codes = ray.get([h.poll.remote() for h in hosts])
            if any(c is not None for c in codes) or time.monotonic() > deadline:
                return _report(ray, hosts, codes, "servers failed to start")
            time.sleep(1.0)
        print(f"{plan.ADDRS_ENV}={','.join(addrs)}", flush=True)
        spec = plan.trainer_spec(config, config_path, overrides, 0, addrs)
        hosts.append(host_cls.options(
            num_cpus=plan.thread_counts(lc)[1] * lc.trainer_nproc,
            num_gpus=lc.trainer_nproc if lc.gpus_per_server else 0,
        ).remote(spec, log_dir, False))
        while True:
            codes = ray.get([h.poll.remote() for h in hosts])
            if codes[-1] == 0:
                return 0
            if any(c is not None for c in codes):
                return _report(ray, hosts, codes, "a part exited")
            time.sleep(1.0)
    finally:
        ray.get([h.stop.remote(lc.stop_grace) for h in hosts], timeout=3 * lc.stop_grace + 10)
        ray.shutdown()


def _report(ray, hosts: list, codes: list, why: str) -> int:
    print(f"arealite.ray: {why} (exit codes {codes})", file=sys.stderr)
    for h, c in zip(hosts, codes):
        if c is not None:
            print("\n".join(ray.get(h.tail.remote())), file=sys.stderr)
    return next((c for c in codes if c), 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m arealite.launcher.ray",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS "
                   "or a new local cluster)")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        if not isinstance(cfg, GRPOConfig):
            raise LaunchError("the Ray launcher places servers and a trainer: kind must be grpo")
        return run(cfg, args.config, list(args.overrides), args.address)
    except (ConfigError, LaunchError) as e:
        print(f"arealite: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Place the servers and the trainer on a Ray cluster (needs ``pip install 'arealite[ray]'``).

``python -m arealite.launcher.ray CONFIG [key=value ...] [--address HOST:PORT | auto]``
(also ``ray job submit -- python -m arealite.launcher.ray CONFIG ...``, which sets RAY_ADDRESS).

Each server runs in a Ray actor holding ``launcher.server_threads`` CPUs,
``launcher.gpus_per_server`` GPUs and ``launcher.ray.server_resources``; it binds the node's IP on
a port free on that node and reports ``ip:port``. Once every server answers ``/health``, the
trainer (``torchrun --nproc-per-node launcher.trainer_nproc``) runs in one actor holding
``launcher.ray.trainer_resources``, with those addresses in ``AREAL_LLM_SERVER_ADDRS``. The
commands are the ones ``arealite train --dry-run`` prints (``arealite.launcher.plan``); only
placement, host and ports differ. Without ``--address`` or RAY_ADDRESS, a local Ray is started.

Failures: a server whose process dies is restarted by Ray (``max_restarts =
launcher.ray.server_restarts``) on the same port when it lands on the same node, and the
trainer's client re-admits it at the current weights; past that, dead servers count against
``launcher.max_server_failures`` as in the local launcher, and one too many stops the run naming
it. A failed trainer (or its actor) stops everything; ``recover.mode=auto`` resumes the run on
the next launch. Actors belong to this driver: if it dies, Ray kills them and their processes
get SIGTERM. Multi-node trainers (torchrun over several nodes) are out of scope; use the Slurm
templates in ``deploy/slurm`` (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from arealite.api.config.experiment import GRPOConfig
from arealite.api.config.loader import ConfigError, load_config
from arealite.launcher import plan, run_folder
from arealite.launcher.plan import LaunchError

POLL_S = 1.0


def _require_ray():
    try:
        import ray
    except ImportError:
        raise LaunchError(
            "the Ray launcher needs ray: pip install 'arealite[ray]' (or use `arealite train` "
            "for one machine, or the Slurm templates in deploy/slurm)"
        ) from None
    return ray


class _Stop(Exception):
    """SIGTERM/SIGINT (e.g. ``ray job stop``): stop everything."""


def say(text: str, err: bool = False) -> None:
    print(f"[launcher] {text}", file=sys.stderr if err else sys.stdout, flush=True)


class _Part:
    """One actor as the launcher sees it: alive, being restarted by Ray, or dead."""

    def __init__(self, name: str, handle) -> None:
        self.name, self.handle = name, handle
        self.info: dict = {}
        self.down_since: float | None = None
        self.dead_polls = 0
        self.restarts = 0

    def poll(self, ray) -> tuple[str, int | None]:
        """("ok", exit code or None) | ("restarting", None) | ("dead", None)."""
        try:
            code = ray.get(self.handle.poll.remote(), timeout=30)
            self.dead_polls = 0
            return "ok", code
        except ray.exceptions.ActorUnavailableError:
            return "restarting", None
        except ray.exceptions.ActorDiedError:
            # a call in flight while the actor dies reports it dead even when Ray restarts it
            self.dead_polls += 1
            return ("dead" if self.dead_polls > 1 else "restarting"), None
        except ray.exceptions.GetTimeoutError:
            return "restarting", None

    def tail(self, ray) -> list[str]:
        try:
            return ray.get(self.handle.tail.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - the actor is gone with its memory of the output
            return [f"(actor gone; see {self.name}.log in the run's logs on that node)"]


class RayLauncher:
    def __init__(self, ray, config: GRPOConfig, config_path: str, overrides: list[str]) -> None:
        from arealite.launcher.ray_host import ProcHost

        self.ray, self.cfg, self.lc = ray, config, config.launcher
        self.config_path, self.overrides = os.path.abspath(config_path), overrides
        self.log_dir = str(plan.log_dir(config).absolute())
        self.host_cls = ray.remote(ProcHost)
        self.servers: list[_Part] = []
        self.trainer: _Part | None = None

    def _fail(self, part: _Part, why: str, code: int | None = None) -> int:
        lines = part.tail(self.ray)
        say(f"{part.name} {why}; its last {len(lines)} lines:", err=True)
        for line in lines:
            print(f"[{part.name}:tail] {line}", file=sys.stderr, flush=True)
        return code if code not in (None, 0) else 1

    def start_servers(self) -> int | None:
        """Start every server actor and wait for /health; None when all are healthy."""
        from arealite.launcher.local import _health_ok

        rl = self.lc.ray
        for spec in plan.server_specs(self.cfg, [0] * self.lc.n_servers):
            opts = {"num_cpus": plan.thread_counts(self.lc)[0], "num_gpus": self.lc.gpus_per_server,
                    "resources": dict(rl.server_resources), "max_restarts": rl.server_restarts}
            handle = self.host_cls.options(**opts).remote(
                spec, self.log_dir, "server", os.getcwd(), restartable=rl.server_restarts > 0)
            self.servers.append(_Part(spec.name, handle))
        deadline = time.monotonic() + self.lc.startup_timeout
        for s in self.servers:
            try:
                s.info = self.ray.get(s.handle.info.remote(),
                                      timeout=max(1.0, deadline - time.monotonic()))
            except self.ray.exceptions.GetTimeoutError:
                return self._fail(s, "was not placed within launcher.startup_timeout (no node "
                                  f"has the resources it asks for: {rl.server_resources}?)")
            except self.ray.exceptions.RayActorError as e:
                return self._fail(s, f"could not start: {e}")
            say(f"{s.name} on node {s.info['node_id'][:12]} ({s.info['ip']}), serving "
                f"{s.info['addr']}")
        pending = list(self.servers)
        while pending:
            for s in list(pending):
                state, code = s.poll(self.ray)
                if state != "ok" or code is not None:
                    return self._fail(s, f"exited ({state}, code {code}) before becoming healthy",
                                      code)
                if _health_ok(s.info["addr"]):
                    say(f"{s.name} healthy at {s.info['addr']}")
                    pending.remove(s)
            if pending and time.monotonic() > deadline:
                return self._fail(pending[0], f"did not become healthy within "
                                  f"{self.lc.startup_timeout:.0f}s (launcher.startup_timeout)")
            if pending:
                time.sleep(POLL_S)
        return None

    def start_trainer(self) -> None:
        addrs = [s.info["addr"] for s in self.servers]
        say(f"servers ready: {plan.ADDRS_ENV}={','.join(addrs)}")
        spec = plan.trainer_spec(self.cfg, self.config_path, self.overrides, 0, addrs)
        wu = self.cfg.weight_update
        # servers on other nodes join the trainer's broadcast group at the trainer's node IP
        # (a transport without a group never reads the address)
        own_address = wu.master_address == "127.0.0.1" and not any(
            o.startswith("weight_update.master_address=") for o in self.overrides)
        handle = self.host_cls.options(
            num_cpus=plan.thread_counts(self.lc)[1] * self.lc.trainer_nproc,
            num_gpus=self.lc.trainer_nproc if self.lc.gpus_per_server else 0,
            resources=dict(self.lc.ray.trainer_resources), max_restarts=0,
        ).remote(spec, self.log_dir, "trainer", os.getcwd(), master_address_override=own_address)
        self.trainer = _Part("trainer", handle)
        try:
            self.trainer.info = self.ray.get(handle.info.remote(), timeout=self.lc.startup_timeout)
        except self.ray.exceptions.GetTimeoutError:
            raise LaunchError(
                "the trainer was not placed within launcher.startup_timeout: no node has "
                f"{plan.thread_counts(self.lc)[1] * self.lc.trainer_nproc} CPUs and "
                f"{self.lc.ray.trainer_resources} free beside the servers") from None
        say(f"trainer on node {self.trainer.info['node_id'][:12]} ({self.trainer.info['ip']}): "
            f"{spec.shell()}")

    def _check_server(self, s: _Part, dead: set[str]) -> int | None:
        state, code = s.poll(self.ray)
        now = time.monotonic()
        if state == "ok" and code is None:
            if s.down_since is not None:
                info = self.ray.get(s.handle.info.remote(), timeout=30)
                moved = "" if info["addr"] == s.info["addr"] else (
                    f" (new address {info['addr']}: the running trainer does not know it)")
                say(f"{s.name} restarted by Ray at {info['addr']}{moved}; the client re-admits "
                    "it once it holds the current weights", err=True)
                s.info, s.down_since = info, None
            return None
        left = s.restarts < self.lc.ray.server_restarts
        if state == "restarting":
            if s.down_since is None:
                s.down_since = now
                if left:
                    s.restarts += 1
                    say(f"{s.name} died; Ray restarts its actor (restart {s.restarts}/"
                        f"{self.lc.ray.server_restarts})", err=True)
            if now - s.down_since < self.lc.startup_timeout:
                return None  # Ray's verdict (back, or dead for good) comes within this
            state = "dead"
        dead.add(s.name)
        why = (f"exited with code {code}" if state == "ok" else
               f"died ({'restart timed out' if left else 'no restarts left'})")
        if len(dead) > self.lc.max_server_failures or len(dead) == len(self.servers):
            return self._fail(s, why, code)
        say(f"{s.name} {why}; continuing on the other servers ({len(dead)}/"
            f"{self.lc.max_server_failures} failures allowed)", err=True)
        return None

    def monitor(self) -> int:
        dead: set[str] = set()
        assert self.trainer is not None
        while True:
            for s in self.servers:
                if s.name not in dead:
                    code = self._check_server(s, dead)
                    if code is not None:
                        return code
            state, code = self.trainer.poll(self.ray)
            if state == "ok" and code == 0:
                say("trainer finished")
                return 0
            if state != "ok" or code is not None:
                why = f"exited with code {code}" if state == "ok" else "actor died"
                return self._fail(self.trainer, why + (
                    "; recover.mode=auto resumes on the next launch"
                    if self.cfg.recover.mode == "auto" else ""), code)
            time.sleep(POLL_S)

    def stop(self) -> None:
        parts = [*([self.trainer] if self.trainer else []), *self.servers]
        say(f"stopping {', '.join(p.name for p in parts) or 'nothing'}")
        for group in ([self.trainer] if self.trainer else [], self.servers):
            refs = []  # the trainer first: it may still talk to servers
            for p in group:
                try:
                    refs.append(p.handle.stop.remote(self.lc.stop_grace))
                except Exception:  # noqa: BLE001 - a dead actor: its processes got SIGTERM
                    pass
            for ref in refs:
                try:
                    self.ray.get(ref, timeout=3 * self.lc.stop_grace + 10)
                except Exception:  # noqa: BLE001
                    pass
        for p in parts:  # frees the workers; no_restart so Ray does not bring them back
            try:
                self.ray.kill(p.handle, no_restart=True)
            except Exception:  # noqa: BLE001
                pass

    def run(self) -> int:
        try:
            code = self.start_servers()
            if code is not None:
                return code
            self.start_trainer()
            return self.monitor()
        except _Stop:
            say("signal received: stopping everything", err=True)
            return 128 + signal.SIGTERM
        finally:
            self.stop()


def run(config: GRPOConfig, config_path: str, overrides: list[str], address: str | None) -> int:
    ray = _require_ray()
    if address is None and not os.environ.get("RAY_ADDRESS"):
        # a local Ray of our own: room for every actor, oversubscribing cores as the local
        # launcher does (Ray's CPUs are only counts)
        lc = config.launcher
        st, tt = plan.thread_counts(lc)
        need = lc.n_servers * st + lc.trainer_nproc * tt
        # address="local": a new one even when `ray start` ran on this machine
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, need),
                 include_dashboard=False, log_to_driver=True)
    else:
        ray.init(address=address, log_to_driver=True)
    old = {}

    def on_signal(signum, _frame):
        raise _Stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        old[sig] = signal.signal(sig, on_signal)
    try:
        launcher = RayLauncher(ray, config, config_path, overrides)
        code = launcher.run()
        say(f"exit status {code}; logs in {launcher.log_dir} on each node", err=code != 0)
        return code
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m arealite.launcher.ray",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--address", default=None, help="Ray cluster address, host:port of the head "
                   "or 'auto' (default: RAY_ADDRESS, else a new local Ray)")
    args = p.parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        if not isinstance(cfg, GRPOConfig):
            raise LaunchError("the Ray launcher places servers and a trainer: kind must be grpo")
        if cfg.launcher.mode != "local":
            raise LaunchError("the Ray launcher starts both sides: launcher.mode must be local")
        if cfg.launcher.reward_model_servers is not None:
            raise LaunchError("the Ray launcher does not start a reward-model pool yet: start it "
                              "yourself and set reward_model.server_addrs (drop "
                              "launcher.reward_model_servers)")
        folder = run_folder.claim(cfg, cfg.launcher.mode)
        ray = _require_ray()
        del ray
    except (ConfigError, LaunchError) as e:
        print(f"arealite: {e}", file=sys.stderr)
        return 2
    folder.apply()
    try:
        return run(cfg, args.config, list(args.overrides), args.address)
    except LaunchError as e:
        print(f"arealite: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

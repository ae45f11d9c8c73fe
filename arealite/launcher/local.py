"""The local launcher: ``arealite train CONFIG [key=value ...] [--dry-run]``.

Starts the server pool (embedded ``servers.launch_server`` or real ``sglang.launch_server``)
and, with ``launcher.reward_model_servers``, a reward-model pool (``launch_server
--is-embedding``, ``launcher/reward_model_servers.py``), waits for every ``/health``, then runs
``torchrun -m arealite.trainer.<kind>`` with the addresses in ``AREAL_LLM_SERVER_ADDRS`` (and
``AREAL_RM_SERVER_ADDRS``). Logs are streamed as ``[server0] ...``/``[trainer] ...`` and written
to ``{fileroot}/{experiment}/{trial}/logs/``. When a part fails, everything stops and the exit
status is non-zero with that part's last lines shown; Ctrl-C or SIGTERM stops everything.
``launcher.mode``: ``local`` (both sides), ``server_only`` (servers until Ctrl-C),
``trainer_only`` (servers given by ``rollout.server_addrs`` or ``AREAL_LLM_SERVER_ADDRS``).
With ``recover.mode=auto`` a failed trainer is restarted (servers kept) from the newest
recovery checkpoint, at most ``recover.retries`` times.

Also ``python -m arealite.launcher.local CONFIG [key=value ...] [--dry-run]``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from arealite.api.config.experiment import BaseExperimentConfig, GRPOConfig
from arealite.api.config.loader import ConfigError, load_config, to_yaml
from arealite.api.reward_model_api import RM_ADDRS_ENV
from arealite.launcher import plan, run_folder
from arealite.launcher import reward_model_servers as rm
from arealite.launcher.plan import LaunchError, ProcSpec
from arealite.launcher.preflight import check_context_parallel, check_modules
from arealite.launcher.preflight_inputs import check_inputs
from arealite.launcher.server_cycle import CYCLE_ENV, ServerCycleHost, write_atomic
from arealite.launcher.supervisor import Console, ManagedProcess, stop_all
from arealite.memplan.launch_check import MemoryRefused, check_memory
from arealite.observe.scrape_config import write_scrape_config
from arealite.utils.network import find_free_port, find_free_ports
from arealite.utils.recover import find_latest, recover_root

POLL_S = 0.2


class _Stop(Exception):
    """A signal asked the launcher to stop."""


class LocalLauncher:
    def __init__(self, config: BaseExperimentConfig, config_path: str, overrides: list[str],
                 console: Console | None = None) -> None:
        self.cfg = config
        self.config_path = config_path
        self.overrides = overrides
        self.lc = plan.launcher_config(config)
        self.log_dir = plan.log_dir(config)
        self.console = console or Console(log_file=None)
        self.servers: list[ManagedProcess] = []
        self.trainer: ManagedProcess | None = None
        self.signum: int | None = None
        self.cycle: ServerCycleHost | None = None  # launcher.colocate_servers=recreate
        self.servers_down = False  # stopped on the trainer's request, not failed
        self.failed = False  # a part failed and said so: the rest stop without more lines

    # ------------------------------------------------------------------ planning
    def mode(self) -> str:
        mode = self.lc.mode
        if not plan.uses_servers(self.cfg):
            if mode == "server_only":
                raise LaunchError(f"kind={self.cfg.kind} uses no servers; server_only is invalid")
            return "trainer_only"
        return mode

    def plan(self) -> tuple[list[ProcSpec], ProcSpec | None]:
        """The server specs and the trainer spec this run starts (ports chosen now)."""
        mode = self.mode()
        servers: list[ProcSpec] = []
        n = self.lc.n_servers if mode in ("local", "server_only") else 0
        n_rm = rm.n_rm_servers(self.cfg, mode)
        # every port at once, so that no two of them can come out the same (the last is the
        # trainer's rendezvous port)
        ports = find_free_ports(n + n_rm + 1)
        if mode in ("local", "server_only"):
            assert isinstance(self.cfg, GRPOConfig)
            servers = plan.server_specs(self.cfg, ports[:n])
            # the reward-model pool's GPUs (if any are handed out) follow the generation servers'
            servers += rm.rm_server_specs(self.cfg, ports[n:n + n_rm],
                                          first_gpu=n * self.lc.gpus_per_server)
        if mode == "server_only":
            return servers, None
        if mode == "local":
            addrs = [s.addr for s in servers if s.addr and not rm.is_rm_server(s.name)]
        else:
            addrs = plan.trainer_addrs(self.cfg) if plan.uses_servers(self.cfg) else None
        trainer = plan.trainer_spec(
            self.cfg, self.config_path, self.overrides, ports[n + n_rm], addrs,
            gpu_offset=plan.trainer_gpu_offset(self.cfg, len(servers)),
        )
        rm_addrs = [s.addr for s in servers if s.addr and rm.is_rm_server(s.name)]
        return servers, rm.with_rm_addrs(trainer, rm_addrs)

    # ------------------------------------------------------------------ running
    def _write_scrape_config(self) -> None:
        addrs = [s.spec.addr for s in self._pool(rm_pool=False) if s.spec.addr]
        if not addrs and plan.uses_servers(self.cfg) and self.mode() == "trainer_only":
            addrs = plan.trainer_addrs(self.cfg)
        path = write_scrape_config(self.cfg, addrs)
        if path is not None:
            self.say(f"Prometheus scrape config: {path} (docs/observability.md)")

    def _pool(self, rm_pool: bool) -> list[ManagedProcess]:
        """The generation servers, or (``rm_pool``) the reward-model servers."""
        return [s for s in self.servers if rm.is_rm_server(s.name) == rm_pool]

    def say(self, text: str, err: bool = False) -> None:
        self.console.line("launcher", text, sys.stderr if err else None)

    def _check_signal(self) -> None:
        if self.signum is not None:
            raise _Stop()

    def _fail(self, part: ManagedProcess, why: str, code: int | None) -> int:
        """One line: what failed, its last error, where the whole of it is (its log file)."""
        self.failed = True
        self.say(f"{part.name} {why}: {part.what_failed()} (full log: {part.log_path})", err=True)
        return code if code not in (None, 0) else 1

    def _wait_healthy(self, servers: list[ManagedProcess] | None = None) -> int | None:
        """None when every server (of ``servers``, default all) answers /health; else the exit
        status of the failure."""
        deadline = time.monotonic() + self.lc.startup_timeout
        pending = list(self.servers if servers is None else servers)
        while pending:
            self._check_signal()
            for s in list(pending):
                code = s.poll()
                if code is not None:
                    return self._fail(s, f"exited with code {code} before becoming healthy", code)
                if _health_ok(s.spec.addr):
                    self.say(f"{s.name} healthy at {s.spec.addr}")
                    pending.remove(s)
            if pending and time.monotonic() > deadline:
                s = pending[0]
                return self._fail(s, f"did not become healthy within {self.lc.startup_timeout:.0f}s"
                                  " (launcher.startup_timeout)", None)
            if pending:
                time.sleep(POLL_S)
        return None

    def _start_trainer(self, spec: ProcSpec) -> None:
        self.trainer = ManagedProcess(spec, self.log_dir, self.console)
        self.say(f"starting trainer: {spec.shell()}")
        self.trainer.start()

    def _monitor(self, trainer_spec: ProcSpec | None) -> int:
        """Watch the processes until the trainer finishes (or forever in server_only mode)."""
        restarts, dead_servers = 0, set()
        last_refresh = 0.0
        while True:
            self._check_signal()
            now = time.monotonic()
            if now - last_refresh > 1.0:  # remember grandchildren (torchrun workers)
                for p in [*self.servers, *([self.trainer] if self.trainer else [])]:
                    p.refresh_descendants()
                last_refresh = now
            code = self._serve_cycle()
            if code is not None:
                return code
            for s in self._pool(rm_pool=True) if self.servers_down else self.servers:
                code = s.poll()
                if code is None or s.name in dead_servers:
                    continue
                dead_servers.add(s.name)
                too_many = len(dead_servers) > self.lc.max_server_failures
                pool = self._pool(rm.is_rm_server(s.name))  # the last of its pool ends the run
                if too_many or all(p.name in dead_servers for p in pool):
                    return self._fail(s, f"exited with code {code}", code)
                self.say(f"{s.name} exited with code {code}; continuing on the other servers "
                         f"({len(dead_servers)}/{self.lc.max_server_failures} failures allowed)",
                         err=True)
            if self.trainer is not None:
                code = self.trainer.poll()
                if code == 0:
                    self.say("trainer finished")
                    return 0
                if code is not None:
                    ckpt = find_latest(recover_root(self.cfg))
                    rc = self.cfg.recover
                    if rc.mode == "auto" and ckpt is not None and restarts < rc.retries:
                        restarts += 1
                        self._fail(self.trainer, f"exited with code {code}", code)
                        self.failed = False  # restarted: the run goes on
                        self.trainer.stop(self.lc.stop_grace)  # leftover workers, if any
                        assert trainer_spec is not None
                        # only the live servers: a restarted trainer waits for every server
                        # it is given, and a dead one would fail each restart in turn
                        env = dict(trainer_spec.env)
                        live = {var: [s.spec.addr for s in self._pool(rm_pool)
                                      if s.name not in dead_servers and s.spec.addr]
                                for rm_pool, var in ((False, plan.ADDRS_ENV), (True, RM_ADDRS_ENV))}
                        for var, addrs in live.items():
                            if var in env:
                                env[var] = ",".join(addrs)
                        self.say(f"restarting the trainer from {ckpt} (restart {restarts}/"
                                 f"{rc.retries}; servers kept: {len(live[plan.ADDRS_ENV])} live)",
                                 err=True)
                        spec = ProcSpec(trainer_spec.name, _with_master_port(
                            trainer_spec.cmd, find_free_port()), env)
                        self._start_trainer(spec)
                        continue
                    return self._fail(self.trainer, f"exited with code {code}", code)
            time.sleep(POLL_S)

    def _serve_cycle(self) -> int | None:
        """A pending stop/start request of the trainer, served (``server_cycle.py``); an exit
        status when the servers did not come back."""
        req = self.cycle.pending() if self.cycle is not None else None
        if req is None:
            return None
        assert self.cycle is not None
        seq, action = req
        t0 = time.monotonic()
        # the generation servers only: a reward-model pool keeps running (the trainer releases
        # its memory instead)
        gen = self._pool(rm_pool=False)
        if action == "stop":
            self.servers_down = True
            stop_all(gen, self.lc.stop_grace)
            self.cycle.answer(seq, True, f"{len(gen)} server(s) stopped in "
                                         f"{time.monotonic() - t0:.2f} s")
        elif action == "start" and self.servers_down:
            # a new seed each life: a server started again with its old --random-seed would
            # replay the same sampling noise every rollout phase
            fresh = [ManagedProcess(_reseeded(s.spec, len(gen)), self.log_dir, self.console)
                     for s in gen]
            self.servers = [*fresh, *self._pool(rm_pool=True)]
            for p in fresh:
                self.say(f"starting {p.name} again: {p.spec.shell()}")
                p.start()
            code = self._wait_healthy(fresh)
            if code is not None:
                self.cycle.answer(seq, False, "a server did not come back (see the launcher log)")
                return code
            self.servers_down = False
            self.cycle.answer(seq, True, f"{len(fresh)} server(s) started in "
                                         f"{time.monotonic() - t0:.2f} s")
        else:
            self.cycle.answer(seq, False, f"cannot {action!r} (servers "
                                          f"{'down' if self.servers_down else 'up'})")
        return None

    def run(self) -> int:
        servers, trainer_spec = self.plan()
        mode = self.mode()
        if (mode == "local" and trainer_spec is not None and self.lc.colocate
                and self.lc.colocate_servers == "recreate"):
            self.cycle = ServerCycleHost(self.cfg.run_dir("server_cycle"))
            trainer_spec = ProcSpec(trainer_spec.name, trainer_spec.cmd,
                                    {**trainer_spec.env, CYCLE_ENV: str(self.cycle.dir)},
                                    trainer_spec.addr)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.say(f"mode={mode}; logs in {self.log_dir}")
        addrs_file = self.cfg.run_dir("server_addrs")
        if servers:  # never leave an earlier run's addresses for a trainer to find
            addrs_file.unlink(missing_ok=True)
        try:
            for spec in servers:
                self.say(f"starting {spec.name}: {spec.shell()}")
                p = ManagedProcess(spec, self.log_dir, self.console)
                self.servers.append(p)
                p.start()
            if self.servers:
                code = self._wait_healthy()
                if code is not None:
                    return code
                gen = self._pool(rm_pool=False)
                line = f"{plan.ADDRS_ENV}={','.join(s.spec.addr or '' for s in gen)}"
                write_atomic(addrs_file, line + "\n")
                self.say(f"servers ready: {line}")
                rm_specs = [s.spec for s in self._pool(rm_pool=True)]
                if rm_specs:
                    self.say(f"reward-model servers ready: {rm.addrs_line(rm_specs)}")
                if mode == "server_only":
                    print(line, flush=True)
                    if rm_specs:
                        print(rm.addrs_line(rm_specs), flush=True)
                    self.say("serving until Ctrl-C")
            self._write_scrape_config()
            if trainer_spec is not None:
                self._start_trainer(trainer_spec)
            return self._monitor(trainer_spec)
        except _Stop:
            name = signal.Signals(self.signum).name if self.signum else "signal"
            self.say(f"{name} received: stopping everything (logs in {self.log_dir})", err=True)
            return 128 + (self.signum or 0)
        finally:
            parts = [*([self.trainer] if self.trainer else []), *self.servers]
            # what the parts print while they are stopped (signal tracebacks) stays in their logs
            self.console.children_muted = True
            if parts and not self.failed and self.signum is None:
                self.say(f"stopping {', '.join(p.name for p in parts)}")
                if self.trainer is not None:  # the trainer first: it may still talk to servers
                    self.trainer.stop(self.lc.stop_grace)
                stop_all(self.servers, self.lc.stop_grace)


def _with_master_port(cmd: list[str], port: int) -> list[str]:
    out = list(cmd)
    i = out.index("--master-port")
    out[i + 1] = str(port)
    return out


def _reseeded(spec: ProcSpec, shift: int) -> ProcSpec:
    """``spec`` with its ``--random-seed`` moved by ``shift`` (unchanged without one)."""
    cmd = list(spec.cmd)
    if "--random-seed" in cmd:
        i = cmd.index("--random-seed") + 1
        cmd[i] = str(int(cmd[i]) + shift)
    return ProcSpec(spec.name, cmd, spec.env, spec.addr)


def _health_ok(addr: str | None) -> bool:
    try:
        with urllib.request.urlopen(f"http://{addr}/health", timeout=2.0) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def dry_run(launcher: LocalLauncher, folder: run_folder.Claim | None = None) -> str:
    servers, trainer = launcher.plan()
    lines = [f"# resolved config (kind={launcher.cfg.kind})", to_yaml(launcher.cfg).rstrip(),
             f"# mode={launcher.mode()}; logs would go to {launcher.log_dir}",
             *([f"# run folder {folder.run_dir}: {folder.action}"] if folder else []),
             "# commands (each in its own process group):"]
    lines += [s.shell() for s in servers]
    if trainer is not None:
        lines.append(trainer.shell())
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arealite train", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="configs/X.yaml")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    p.add_argument("--dry-run", action="store_true",
                   help="print the resolved config and the commands, start nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        launcher = LocalLauncher(cfg, args.config, list(args.overrides))
        if launcher.mode() != "server_only":
            check_modules(cfg, args.config)  # one line now, not torchrun's traceback later
            check_context_parallel(cfg)
            check_inputs(cfg)  # data, reward, eval hook, models, context, ports
        folder = run_folder.claim(cfg, launcher.mode())
        if args.dry_run:
            sys.stdout.write(dry_run(launcher, folder))
            return 0
        memory = check_memory(cfg)  # GPU runs: the plan's peak against the GPU (memplan)
        if memory:
            print(f"arealite: {memory}", file=sys.stderr)
    except (ConfigError, LaunchError, MemoryRefused) as e:
        kind = {ConfigError: "config", MemoryRefused: "memory"}.get(type(e), "launch")
        print(f"arealite: {kind} error: {e}", file=sys.stderr)
        return 2
    folder.apply()  # overwrite: the earlier run's files go before anything of this one is written
    log_dir = plan.log_dir(cfg)
    log_dir.mkdir(parents=True, exist_ok=True)
    launcher.console = Console(log_file=Path(log_dir) / "launcher.log")
    if folder.action != "fresh":
        launcher.say(f"{folder.action}: {folder.run_dir}"
                     + (" (launcher.overwrite=true)" if folder.action == "overwrite"
                        else " from its newest recovery checkpoint"))
    old = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, _frame):
            launcher.signum = signum
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, on_signal)
    try:
        code = launcher.run()
        if not launcher.failed and launcher.signum is None:  # a failure or a stop said it already
            launcher.say(f"exit status {code}; logs in {log_dir}", err=code != 0)
    except LaunchError as e:
        print(f"arealite: launch error: {e}", file=sys.stderr)
        code = 2
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        launcher.console.close()
    return code


if __name__ == "__main__":
    sys.exit(main())

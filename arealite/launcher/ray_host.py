"""The body of a Ray actor that owns one launcher process (a server or the trainer) on its node.

Runs inside a Ray worker; ``arealite.launcher.ray`` wraps it with ``ray.remote``. The process is
a ``supervisor.ManagedProcess`` (own session, SIGTERM when the actor's worker dies, descendants
remembered), started from the ``ProcSpec`` the plan built; only the host and port differ.

Restarts: a server actor created with ``max_restarts > 0`` exits its worker when its server
process dies, so that Ray restarts the actor (``restartable``). The restarted actor binds the
same port when Ray placed it on the same node (recorded in ``logs/<name>.addr``), so the
trainer's client, which knows servers only by address, probes it, re-syncs it to the current
weights and re-admits it. A server actor on another node gets a new address, which the
running trainer never learns (it routes around it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import psutil

from arealite.launcher.plan import ProcSpec
from arealite.launcher.supervisor import Console, ManagedProcess
from arealite.utils.network import find_free_port

PORT_WAIT_S = 30.0  # a killed server's port, still held while it shuts down


def _port_free(ip: str, port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        s.bind((ip, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _stop_previous(pid: int, port: int) -> None:
    """SIGKILL the group of the server an earlier incarnation of this actor started, when it is
    still running (its worker was killed; the server only got SIGTERM). The port on its command
    line guards against a reused pid."""
    with contextlib.suppress(psutil.Error, OSError):
        p = psutil.Process(pid)
        cmd = p.cmdline()
        if "--port" in cmd and cmd[cmd.index("--port") + 1] == str(port):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
            p.wait(timeout=10)


class ProcHost:
    """Starts ``spec`` on this actor's node; the launcher polls it (see module docstring)."""

    def __init__(self, spec: ProcSpec, log_dir: str, role: str, cwd: str,
                 restartable: bool = False, master_address_override: bool = False) -> None:
        import ray

        if os.path.isdir(cwd):  # relative paths in the config mean the launcher's directory
            os.chdir(cwd)
        self.ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        logs = Path(log_dir)
        logs.mkdir(parents=True, exist_ok=True)
        cmd = list(spec.cmd)
        addr = None
        if role == "server":
            port = self._port(logs / f"{spec.name}.addr")
            cmd[cmd.index("--host") + 1] = self.ip
            cmd[cmd.index("--port") + 1] = str(port)
            addr = f"{self.ip}:{port}"
        else:
            cmd[cmd.index("--master-port") + 1] = str(find_free_port())
            if master_address_override:  # servers on other nodes join the trainer's group here
                cmd.append(f"weight_update.master_address={self.ip}")
        # Ray already set CUDA_VISIBLE_DEVICES for the GPUs this actor holds.
        env = {k: v for k, v in spec.env.items() if k != "CUDA_VISIBLE_DEVICES"}
        self.proc = ManagedProcess(ProcSpec(spec.name, cmd, env, addr), logs, Console())
        self.stopping = False
        self.proc.start()
        if addr is not None:
            (logs / f"{spec.name}.addr").write_text(json.dumps(
                {"ip": self.ip, "port": int(addr.rsplit(":", 1)[1]), "pid": self.proc.pid}))
        if restartable:
            threading.Thread(target=self._exit_with_child, daemon=True).start()

    def _port(self, record: Path) -> int:
        """A fresh port, or after a restart on the same node the one the server had."""
        import ray

        if ray.get_runtime_context().was_current_actor_reconstructed and record.is_file():
            prev = json.loads(record.read_text())
            if prev.get("ip") == self.ip:
                _stop_previous(int(prev["pid"]), int(prev["port"]))
                deadline = time.monotonic() + PORT_WAIT_S
                while not _port_free(self.ip, prev["port"]) and time.monotonic() < deadline:
                    time.sleep(0.2)
                return int(prev["port"])
        return find_free_port(self.ip)

    def _exit_with_child(self) -> None:
        assert self.proc.proc is not None
        code = self.proc.proc.wait()
        if self.stopping:  # the launcher stopped it: no restart
            return
        self.proc.stop(2.0)  # descendants it left behind
        print(f"[{self.proc.name}] exited with code {code}; exiting the actor so Ray restarts it",
              flush=True)
        os._exit(1)

    def info(self) -> dict:
        return {"addr": self.proc.spec.addr, "ip": self.ip, "node_id": self.node_id,
                "pid": self.proc.pid, "actor_pid": os.getpid()}

    def poll(self) -> int | None:
        self.proc.refresh_descendants()
        return self.proc.poll()

    def tail(self) -> list[str]:
        return self.proc.tail()

    def stop(self, grace: float) -> None:
        self.stopping = True
        self.proc.stop(grace)

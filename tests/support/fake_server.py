"""A stand-in server for the launcher's own tests (the real one is tested with it elsewhere).

Accepts ``launch_server``'s flags, answers ``GET /health``; ``FAKE_SERVER_MODE`` picks a
behaviour: ``ok`` (serve), ``hang`` (never become healthy), ``crash`` (exit 3 at start-up),
``die:N`` (serve, then exit 9 after N seconds), ``stubborn`` (serve and ignore SIGTERM).
With ``FAKE_SERVER_ONLY_SEED=S`` the mode applies only to the server given ``--random-seed S``
(the launcher gives server i seed ``servers.random_seed + i``); the others serve normally.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = str(os.getpid()).encode() if self.path == "/pid" else b""
        self.send_response(200 if self.path in ("/health", "/pid") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-path", required=True)
    p.add_argument("--weight-version", required=True)
    p.add_argument("--random-seed")
    args, _ = p.parse_known_args()
    mode = os.environ.get("FAKE_SERVER_MODE", "ok")
    only = os.environ.get("FAKE_SERVER_ONLY_SEED")
    if only is not None and only != args.random_seed:
        mode = "ok"
    print(f"fake server pid={os.getpid()} mode={mode} omp={os.environ.get('OMP_NUM_THREADS')}",
          flush=True)
    if mode == "crash":
        print(f"fatal: cannot load model from {args.model_path}", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "hang":
        time.sleep(600)
        return
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    if mode.startswith("die:"):
        signal.signal(signal.SIGALRM, lambda *_: os._exit(9))
        signal.alarm(int(mode.split(":")[1]))
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()

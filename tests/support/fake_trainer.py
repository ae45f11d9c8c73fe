"""A stand-in trainer module for the launcher's tests, run by torchrun as ``-m`` with
``CONFIG key=value ...`` like ``arealite.trainer.grpo``. ``FAKE_TRAINER_MODE``:
``ok`` (reach every server in AREAL_LLM_SERVER_ADDRS, write rank<R>.ok, exit 0),
``fail`` (print a message and exit 7), ``recover`` (without a recovery checkpoint: save one and
exit 5; with one: exit 0; each run appends its pid and server addresses to trainer_runs.txt),
``recover-after:N`` (the same, crashing N seconds in), ``hang`` (start a grandchild in a session of its own, then sleep),
``wait:N`` (sleep N seconds, exit 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def say(text: str, stream=None) -> None:
    """One line in one write: the ranks share the launcher's pipe, and ``print`` writes the
    text and its newline separately, so two ranks' lines can interleave mid-line."""
    stream = stream or sys.stdout
    stream.write(text + "\n")
    stream.flush()


def main() -> int:
    from arealite.api.config.loader import load_config
    from arealite.utils.recover import RecoverInfo, recover_root, save_checkpoint, should_recover

    cfg = load_config(sys.argv[1], sys.argv[2:])
    rank = int(os.environ["RANK"])
    out = Path(cfg.cluster.fileroot)
    mode = os.environ.get("FAKE_TRAINER_MODE", "ok")
    addrs = [a for a in os.environ.get("AREAL_LLM_SERVER_ADDRS", "").split(",") if a]
    say(f"trainer rank {rank}/{os.environ['WORLD_SIZE']} mode={mode} addrs={addrs}")
    if mode == "ok":
        for a in addrs:
            with urllib.request.urlopen(f"http://{a}/health", timeout=5) as r:
                assert r.status == 200
        (out / f"rank{rank}.ok").write_text(json.dumps(
            {"addrs": addrs, "omp": os.environ.get("OMP_NUM_THREADS")}))
        return 0
    if mode == "fail":
        say(f"boom: trainer rank {rank} cannot continue", sys.stderr)
        return 7
    if mode == "recover" or mode.startswith("recover-after:"):
        with open(out / "trainer_runs.txt", "a") as f:
            f.write(f"{os.getpid()} {','.join(addrs)}\n")
        if mode.startswith("recover-after:") and not should_recover(cfg):
            time.sleep(float(mode.split(":")[1]))  # crash only after this long
        if should_recover(cfg):
            say("resumed from a recovery checkpoint")
            return 0
        save_checkpoint(recover_root(cfg), RecoverInfo(step=3, epoch=0, epoch_step=3, version=3),
                        rank=rank)
        say("crashing after a checkpoint")
        return 5
    if mode == "hang":
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)", str(out)],
            start_new_session=True)
        (out / f"grandchild{rank}.pid").write_text(str(child.pid))
        time.sleep(600)
        return 0
    if mode.startswith("wait:"):
        time.sleep(float(mode.split(":")[1]))
        return 0
    raise SystemExit(f"unknown FAKE_TRAINER_MODE {mode}")


if __name__ == "__main__":
    sys.exit(main())

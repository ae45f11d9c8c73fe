"""Every shell command of README.md and docs/*.md, as written (#37): in a temporary copy of the
repository's configs and the own-task example, with the main job's assets built there and the
docs' placeholders given values. Commands of seconds run as written; runs of minutes (or on
GPUs) run as ``--dry-run``, which makes every pre-launch check (config, data, reward, models,
context, ports, run folder); a whole job's configs are resolved with the command's overrides;
what needs a cluster or an external tool is not run, for the reason its rule gives
(``tests/support/doc_commands.py``, the reviewed plan). A command no rule covers fails. The
commands that talk to servers (the curl recipes) run in the integration part, one shell per doc,
against the pool and gateways the docs' own commands start (``tests/support/doc_session.py``)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from arealite.api.config.loader import load_config
from arealite.cli.main import main as arealite
from arealite.demo import agent_job, main_job, vision_job
from arealite.demo.toy_math import write_toy_math
from arealite.utils.network import find_free_ports
from tests.support.doc_commands import (
    PLACEHOLDERS,
    PRODUCES,
    ROOT,
    SESSIONS,
    commands,
    docs,
    plan,
    untagged_command_blocks,
)
from tests.support.doc_session import Session

JOBS = {"main-job": main_job, "agent-job": agent_job, "vision-job": vision_job}


@pytest.fixture
def work(tmp_path, tiny_model_dir) -> Path:
    """A user's clone after `make run` built the assets (the warm start stands in as the tiny
    model itself: the checks read its config and tokenizer, nothing trains here)."""
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    shutil.copytree(ROOT / "examples" / "own_task", tmp_path / "my_task",
                    ignore=shutil.ignore_patterns("model", "outputs", "__pycache__"))
    assets = tmp_path / "outputs" / "assets"
    assets.mkdir(parents=True)
    for name in ("tiny_model", "sft_model"):
        (assets / name).symlink_to(tiny_model_dir)
    write_toy_math(assets / "toy_math", n_train=3000, n_valid=200, seed=0)
    # the folders `make run` leaves: a documented command must not need (or write into) them
    for run in ("toy-grpo/main", "toy-sft/warm-start"):
        (tmp_path / "outputs" / run / "logs").mkdir(parents=True)
        (tmp_path / "outputs" / run / "logs" / "metrics.jsonl").write_text('{"step": 0}\n')
    return tmp_path


def _words(text: str) -> list[str]:
    for k, v in PLACEHOLDERS.items():
        text = text.replace(k, v)
    return shlex.split(text)


def _job_configs(words: list[str]) -> None:
    """A job command's overrides, applied to the job's GRPO and SFT configs (a config error
    raises, naming the key)."""
    if words[0] == "make":  # `make run` is `arealite main-job launcher.overwrite=true`
        job, overrides = main_job, ["launcher.overwrite=true"]
    else:
        job, overrides = JOBS[words[1]], words[2:]
    grpo, sft = main_job.split_sft_overrides(overrides)
    load_config(job.GRPO_CONFIG, grpo)
    load_config(job.SFT_CONFIG, sft)


def test_no_untagged_command_block():
    bad = {d.name: lines for d in docs() if (lines := untagged_command_blocks(d))}
    assert not bad, f"tag these blocks ```bash (or move the command out): {bad}"


@pytest.fixture
def forget_user_modules(work):
    """The own-task modules (reward, evaluate, options) imported from the copy are dropped
    afterwards, so no later test in this process finds them under those names."""
    yield
    for name, mod in list(sys.modules.items()):
        if str(getattr(mod, "__file__", "") or "").startswith(str(work)):
            del sys.modules[name]


def test_every_documented_command_works_as_written(work, tiny_model_dir, monkeypatch, capsys,
                                                   forget_user_modules):
    unplanned, failed, skipped = [], [], []
    for doc in docs():
        for cmd in commands(doc):
            step = plan(cmd)
            where = f"{cmd.doc}:{cmd.line}: {cmd.text}"
            if step is None:
                unplanned.append(where)
                continue
            if step.how in ("skip", "session"):
                skipped.append(f"{where} ({step.why})")
                continue
            cwd = work / "my_task" if doc.name == "own_task.md" else work
            monkeypatch.chdir(cwd)
            words = _words(cmd.text)
            if step.how == "job-config":
                try:
                    _job_configs(words)
                except Exception as e:  # noqa: BLE001 - reported with the command
                    failed.append(f"{where}\n  {e}")
                continue
            if Path(words[0]).name == "arealite":
                args = words[1:] + (["--dry-run"] if step.how == "dry-run" else [])
                code = arealite(args)
                out = capsys.readouterr()
                if code != 0:
                    failed.append(f"{where}\n  exit {code}: {out.err.strip()[-600:]}")
                if cmd.text in PRODUCES:
                    made = cwd / PRODUCES[cmd.text]
                    made.parent.mkdir(parents=True, exist_ok=True)
                    made.symlink_to(tiny_model_dir)
                continue
            words[0] = sys.executable if words[0].endswith("python") else words[0]
            res = subprocess.run(words, cwd=cwd, capture_output=True, text=True, timeout=120)
            if res.returncode != 0:
                failed.append(f"{where}\n  exit {res.returncode}: {res.stderr.strip()[-600:]}")
    assert not unplanned, "commands no rule of tests/support/doc_commands.py covers:\n" + \
        "\n".join(unplanned)
    assert not failed, "documented commands that fail as written:\n" + "\n".join(failed)
    print(f"{len(skipped)} commands not run here:\n" + "\n".join(skipped))


@pytest.fixture
def served(tmp_path, tiny_model_dir) -> Path:
    """A clone after `make run` built its warm start, as a real folder (a server refuses a load
    whose real path leaves its --weight-load-root, so no symlink), with the clone's .venv."""
    shutil.copytree(tiny_model_dir, tmp_path / "outputs" / "assets" / "sft_model")
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    return tmp_path


def _session_values(doc: str, addrs: list[str], gateway: int, ckpt: Path) -> dict[str, str]:
    """The docs' fixed ports and example addresses, as this machine's: free ports, the pool
    that docs/weight_updates.md's recipe started, a checkpoint under its --weight-load-root."""
    if doc == "docs/weight_updates.md":  # starts the pool; its gateway on a free port
        return {"--port 30000": f"--port {gateway}", "127.0.0.1:30000": f"127.0.0.1:{gateway}"}
    return {
        "127.0.0.1:40111,127.0.0.1:40112": ",".join(addrs),
        "127.0.0.1:30000": addrs[0],
        "--port 8000": f"--port {gateway}",
        "127.0.0.1:8000": f"127.0.0.1:{gateway}",
        "/ckpt/step3": str(ckpt),
    }


@pytest.mark.integration
def test_server_commands_work_as_written(served):
    """docs/weight_updates.md's curl recipe (its pool, its gateway, a disk load through it) and
    docs/servers.md's curl examples (one server of that pool, a second gateway over it), each
    doc's commands in order in one shell: a command that fails, or a curl answered with an
    HTTP error, fails the test."""
    assert shutil.which("curl"), "the docs' recipes need curl"
    ckpt = served / "outputs" / "checkpoints" / "step3"
    shutil.copytree(served / "outputs" / "assets" / "sft_model", ckpt)
    addrs: list[str] = []
    outs: dict[str, str] = {}
    session = Session(served, "docs")
    try:
        for i, doc in enumerate(SESSIONS):
            cmds = [c for c in commands(ROOT / doc) if plan(c).how == "session"]
            values = _session_values(doc, addrs, find_free_ports(1)[0], ckpt)
            text = " ".join(c.text for c in cmds)
            assert all(k in text for k in values), f"{doc}: a placeholder the test fills is gone"
            code, outs[doc] = session.run(cmds, values, timeout=240 if i == 0 else 90)
            pool = (served / "pool.out").read_text() if (served / "pool.out").exists() else ""
            assert code == 0, f"{doc}: exit {code}\n{outs[doc][-3000:]}\npool.out: {pool[-1000:]}"
            if not addrs:
                addrs = pool.split("AREAL_LLM_SERVER_ADDRS=", 1)[1].split()[0].split(",")
    finally:
        session.stop()
    # what the docs say the answers hold
    assert outs["docs/weight_updates.md"].count("Weight version updated to 1") == 2
    assert '"weight_version":"3"' in outs["docs/servers.md"].replace(" ", "")

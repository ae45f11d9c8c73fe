"""The shell commands of README.md and docs/*.md (``bash``/``sh`` fenced blocks), and the
reviewed plan for each: run as written, run as ``--dry-run`` (a run of minutes, or one that needs
GPUs), resolve a whole job's configs with the command's overrides, or not run here (a cluster,
a server to talk to, an external tool), each with its reason. A command no rule matches fails
the docs test until someone decides how it is checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGS = ("bash", "sh", "shell")
# how an untagged block that holds a command starts: such a block must be tagged bash
COMMAND_START = re.compile(r"^(make |\.venv/bin/|\.venv-vllm/bin/|arealite |python |curl |"
                           r"docker |prometheus |torchrun |ray |sbatch )")
# placeholders of the docs, and the values the test computes for them
PLACEHOLDERS = {"$LR": "1e-3"}
# a command checked as a dry run whose output a later command reads: after it, the test puts a
# real model there (the tiny model stands in for the trained one; the checks read its files)
PRODUCES = {"arealite train own_task_sft.yaml": "outputs/own-task-sft/run0/model"}


@dataclass(frozen=True)
class Command:
    doc: str  # README.md, docs/x.md
    line: int
    text: str  # continuation lines joined, trailing comment dropped


@dataclass(frozen=True)
class Step:
    how: str  # run | dry-run | job-config | skip
    why: str


_ARE = r"^(\.venv/bin/)?arealite "
# (pattern, how, why): the first match decides; reviewed like code.
RULES: list[tuple[str, str, str]] = [
    (_ARE + r"plot outputs/", "skip", "plots a finished run's metrics; "
     "tests/examples/test_own_task.py trains and plots"),
    (_ARE + r"(config|tiny-model|toy-data) ", "run", "seconds"),
    (_ARE + r"train .*--dry-run$", "run", "a dry run: every pre-launch check, nothing started"),
    (_ARE + r"train ", "dry-run", "servers and a trainer for minutes (or GPUs): the dry run "
     "makes every pre-launch check of the same command"),
    (_ARE + r"main-job --moe", "skip", "the MoE job builds its own assets (minutes); "
     "tests/trainer/test_moe_grpo.py runs its GRPO with routing replay"),
    (_ARE + r"real-model-job", "skip", "imports SmolLM2 and trains it for minutes; "
     "tests/trainer/test_smollm2_grpo.py runs its short form, tests/cli/test_cli.py its "
     "refusal of an unknown task"),
    (_ARE + r"rg-data ", "run", "seconds"),
    (_ARE + r"(main|agent|vision)-job", "job-config", "a whole job (minutes): its GRPO and SFT "
     "configs are resolved with the command's overrides"),
    (r"^make run$", "job-config", "the main job (minutes), as `arealite main-job`"),
    (r"^\.venv/bin/python -c \"from arealite\.demo\.toy_math import", "run", "seconds"),
    (r"^python make_data\.py$", "run", "seconds"),
    (r"^make (test|setup-vllm|setup-trl)", "skip", "the suite itself / an install"),
    (r"^make gpu-check", "skip", "a benchmark of minutes (tests/benchmarks/gpu_check runs its parts)"),
    (r"^\.venv/bin/python -m pytest", "skip", "the suite itself"),
    (r"^(ray |RAY_ADDRESS=|python -m arealite\.launcher\.ray )", "skip",
     "a Ray cluster (tests/launcher/test_launcher_ray.py starts one)"),
    (r"^(export AREALITE_DEPLOY=|N_SERVER_NODES=|SERVERS_ROOT=)", "skip",
     "Slurm (tests/deploy and tests/launcher/test_launcher_slurm.py check the templates)"),
    (r"^(prometheus |docker )", "skip", "an external tool"),
    (r"^\.venv/bin/python -m arealite\.observe\.trace_plot ", "skip",
     "needs a traced run (tests/observe check trace_plot)"),
    (r"^(curl |[A-Z]+=http|ADDRS=|until |(\.venv/bin/)?python -m servers\.|export \$\(grep|"
     r"\.venv/bin/torchrun |VLLM_SERVER_DEV_MODE=)", "skip",
     "talks to running servers (tests/servers and tests/weights drive the same routes)"),
    (r"^python -m (tests\.support\.fuzz_servers|benchmarks\.)", "skip",
     "a benchmark or fuzz run of minutes"),
]


def plan(cmd: Command) -> Step | None:
    for pattern, how, why in RULES:
        if re.search(pattern, cmd.text):
            return Step(how, why)
    return None


def _strip_comment(line: str) -> str:
    """``cmd   # why`` -> ``cmd`` (a ``#`` inside quotes is kept)."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands(doc: Path) -> list[Command]:
    """Every command of the doc's shell blocks, in order."""
    out: list[Command] = []
    lines = doc.read_text().splitlines()
    in_block, lang, pending, start = False, "", "", 0
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_block, lang = (not in_block), line[3:].strip()
            continue
        if not in_block or lang not in SHELL_LANGS:
            continue
        text = _strip_comment(line)
        if not pending:
            start = n
            if not text.strip():
                continue
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        if (pending + text).count("'") % 2:  # a quoted argument spans lines (curl -d '{...}')
            pending += text.strip() + " "
            continue
        full = (pending + text.strip()).strip()
        pending = ""
        if full:
            out.append(Command(str(doc.relative_to(ROOT)), start, full))
    return out


def untagged_command_blocks(doc: Path) -> list[int]:
    """Lines of untagged fenced blocks that start with a command (they must be tagged)."""
    bad, lines = [], doc.read_text().splitlines()
    in_block = False
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            if not in_block and line.strip() == "```" and n < len(lines):
                if COMMAND_START.match(lines[n]):
                    bad.append(n)
            in_block = not in_block
    return bad


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

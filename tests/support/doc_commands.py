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
    how: str  # run | dry-run | job-config | session | skip
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
    (_ARE + r"plan ", "skip", "plans a GPU-size model (a minute or more of CPU): "
     "tests/memplan/test_plan_cli.py and test_launch_check.py plan small shapes"),
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
    (r"^(\.venv/bin/)?python -m servers\.launch_server --model-path /path/to/hf_model ", "skip",
     "one server in the foreground: docs/weight_updates.md's pool, which the docs test starts, "
     "runs this command for each server (servers/launch_pool.py)"),
    (r"^(\.venv/bin/)?python -m servers\.launch_pool --n 4 .*\[", "skip",
     "a usage synopsis ([optional] flags): the docs test starts docs/weight_updates.md's pool"),
    (r"^(\.venv/bin/)?python -m servers\.launch_server .*--lora-paths|^curl -s localhost:30000/"
     r"(load_lora_adapter|unload_lora_adapter|generate -d '\{\"input_ids\": \[\[5)", "skip",
     "a server with the adapters of a trained run: tests/servers/test_server_lora.py drives "
     "/load_lora_adapter, per-row lora_path and /unload_lora_adapter"),
    (r"^curl -s \$S/(init_weights_update_group|begin_weight_update|"
     r"update_weights_from_distributed|end_weight_update) ", "skip",
     "needs a trainer process as rank 0 of the broadcast group: tests/servers/weights/"
     "test_server_weights.py drives these four calls with one"),
    (r"^curl -s localhost:30000/generate .*image_data", "skip",
     "a vision-language model's server: tests/servers/test_server_vision.py sends image_data "
     "with a text prompt and an image path"),
    (r"^VLLM_SERVER_DEV_MODE=", "skip", "real vLLM starts in about a minute: tests/backends/"
     "test_vllm_backend_integration.py starts its servers with this command "
     "(arealite/backends/vllm/server_command.py)"),
    (r"^python -m (tests\.support\.fuzz_servers|benchmarks\.)", "skip",
     "a benchmark or fuzz run of minutes"),
]


# rules for one doc's commands, checked before RULES
DOC_RULES: dict[str, list[tuple[str, str, str]]] = {
    "docs/tinker.md": [
        (r".", "skip", "a server, the Tinker service and an SDK client for minutes: "
         "tests/tinker/test_service.py starts the same service (arealite tinker-server over an "
         "embedded server with --enable-lora) and drives it with the unmodified SDK"),
    ],
    "docs/environments.md": [
        (r".", "skip", "verifiers' environments trained for minutes on the toy warm start: "
         "tests/workflows/envs/test_verifiers_env.py exports the same example environments, runs "
         "them through the workflow token-exact and checks their rewards against verifiers' own "
         "eval"),
    ],
    "docs/quickstart.md": [
        (r"^\.venv/bin/python -m servers\.launch_pool |^until grep |^export \$\(grep |"
         r"^\.venv/bin/torchrun .* -m arealite\.trainer\.grpo ", "skip",
         "the by-hand trainer is a run of minutes (tests/launcher/test_launcher_run.py::"
         "test_server_only_then_trainer_only runs a trainer against servers started apart); its "
         "pool is docs/weight_updates.md's (less --weight-load-root), which the docs test starts"),
    ],
}
# docs whose commands that talk to servers run in one shell per doc, in order, against live
# servers (tests/test_docs_commands.py::test_server_commands_work_as_written, integration):
# doc -> the commands run there. weight_updates.md first: its pool serves the later docs.
SESSIONS: dict[str, str] = {
    "docs/weight_updates.md": r"^(\.venv/bin/python -m servers\.(launch_pool|gateway) |until |"
                              r"ADDRS=|G=|curl )",
    "docs/servers.md": r"^(S=|G=|\.venv/bin/python -m servers\.gateway |"
                       r"curl -s(N| -X POST)? \$[SG]/)",
}
SESSION_WHY = "talks to servers: run by the docs test's integration part, against a live pool"


def plan(cmd: Command) -> Step | None:
    rules = DOC_RULES.get(cmd.doc, []) + RULES
    step = next((Step(how, why) for pattern, how, why in rules if re.search(pattern, cmd.text)),
                None)
    session = SESSIONS.get(cmd.doc)
    if session and re.search(session, cmd.text) and (step is None or step.how != "skip"):
        return Step("session", SESSION_WHY)
    return step


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

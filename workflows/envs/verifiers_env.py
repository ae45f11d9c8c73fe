"""``VerifiersWorkflow``: train on a ``verifiers`` (0.4, ``verifiers.v1``) environment as it is.

The environment is loaded by id with its own config (``kwargs.env``: verifiers' ``EnvConfig``
as a mapping: ``taskset`` with its ``id`` and fields, the agent's ``harness`` and ``runtime``,
``judges`` on the taskset's ``task``), exactly as verifiers' ``EnvServer`` and eval entry point
load it (``verifiers.v1.load_environment``). Each data row is one task in verifiers' wire form
(its ``TaskData`` dump, what an ``EnvServer`` receives; ``export_tasks`` writes a taskset's rows
to a JSONL file). For a row the workflow runs ``n_episodes`` episodes of the task the way
verifiers runs them (``Env.run_slot`` inside ``Env.serving()``: the harness program in its
runtime, its model calls through verifiers' interception server), with the episode's client
pointed at a session of arealite's agent proxy served over HTTP. The proxy applies the chat
template and generates token-in/token-out on the run's servers, so every token the policy
generated is recorded with its log-prob and weight version (``arealite/agent``); the workflow
checks that the trace made exactly the calls the session recorded.

Rewards: the episode's trainable trace's ``reward`` (verifiers' weighted sum of its rewards and
judges) is the return of the session's last turn. Episodes of a row form one GRPO group, formed
here as ``AgentWorkflow`` forms it (``group_baseline``/``group_scale`` on every row): train with
``gconfig.n_samples=1`` and ``actor.group_size=1``. An environment that scores a group jointly
does it in its ``Env.finalize`` over an episode (verifiers' ``best_of_n``): that episode's traces
then all see the whole group. Trace metrics ride on each row as ``metric/<name>`` (NaN when
unrecorded). A failed episode (a harness error, a timeout, a scoring error: ``episode.ok`` false)
fails the row with ``VerifiersEpisodeError`` and its first error (the executor draws again).

Depends on ``arealite.api`` only (the proxy is named by import path, ``kwargs.proxy``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.trajectory import TensorDict, pad_sequences_to_tensors
from arealite.api.workflow_api import GenerateEngine, RolloutWorkflow
from arealite.api.workflow_factory import import_by_path

MODEL_NAME = "arealite-policy"
# verifiers imports tasksets, harnesses and judges by id as top-level modules
PLUGINS = Path(__file__).resolve().parent / "vf_plugins"


def add_env_paths(paths: list[str | Path] | None = None) -> None:
    """Put this room's verifiers plugins and ``paths`` (folders holding environment modules)
    on ``sys.path`` and ``PYTHONPATH`` (the harness's runtime inherits it)."""
    for p in [PLUGINS, *(paths or [])]:
        p = str(Path(p).resolve())
        if p not in sys.path:
            sys.path.insert(0, p)
        parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if p not in parts:
            os.environ["PYTHONPATH"] = os.pathsep.join([p, *[x for x in parts if x]])


class VerifiersEpisodeError(RuntimeError):
    """A verifiers episode did not finish cleanly (its first error, named)."""


def env_config(env: dict[str, Any], env_paths: list[str] | None = None) -> Any:
    """verifiers' ``EnvConfig`` subclass of the environment ``env`` names, validated from
    ``env`` (what ``vf-eval``'s ``--env.*`` flags build)."""
    add_env_paths(env_paths)
    import verifiers.v1 as vf

    if not isinstance(env, dict) or not (env.get("taskset") or {}).get("id"):
        raise ValueError("kwargs.env must be a mapping with taskset.id (a verifiers taskset)")
    # a copy: verifiers' validators narrow the plugin fields of the mapping in place
    env = copy.deepcopy(env)
    return vf.env_config_type(env["taskset"]["id"], env.get("id", "")).model_validate(env)


def export_tasks(env: dict[str, Any], out: str | Path, limit: int | None = None,
                 env_paths: list[str] | None = None) -> int:
    """Write the taskset's tasks as training rows (their wire ``TaskData`` dumps), one JSON
    object a line; returns how many."""
    import verifiers.v1 as vf

    taskset = vf.load_taskset(env_config(env, env_paths).taskset)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with out.open("w") as f:
        for task in taskset:
            if limit is not None and n >= limit:
                break
            f.write(json.dumps(task.data.model_dump(mode="json")) + "\n")
            n += 1
    return n


def trace_metrics(traces: list[Any], names: list[str]) -> dict[str, float]:
    vals: dict[str, list[float]] = {n: [] for n in names}
    for t in traces:
        for n in names:
            v = t.metrics.get(n)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                vals[n].append(float(v))
    return {f"metric/{n}": (sum(v) / len(v) if v else math.nan) for n, v in vals.items()}


class VerifiersWorkflow(RolloutWorkflow):
    def __init__(
        self,
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        *,
        env: dict[str, Any],
        proxy: str,
        env_paths: list[str] | None = None,
        n_episodes: int = 4,
        metrics: list[str] | None = None,
        turn_discount: float = 1.0,
        model: str = MODEL_NAME,
    ) -> None:
        """``env_paths``: folders holding environment modules that are not installed packages;
        ``metrics``: the trace metrics to carry as ``metric/<name>`` row stats."""
        if gconfig.n_samples != 1:
            raise ValueError("VerifiersWorkflow groups episodes itself: set gconfig.n_samples=1 "
                             "(and actor.group_size=1) and the group size with "
                             "kwargs.n_episodes")
        if n_episodes < 1:
            raise ValueError("n_episodes must be >= 1")
        self.config = env_config(env, env_paths)
        import verifiers.v1 as vf

        self.vf = vf
        self.env = vf.load_environment(self.config)
        task_cls = type(self.env.taskset).task_type()
        self.task_cls, self.data_cls = task_cls, task_cls.data_type()
        self.proxy_cls = import_by_path(proxy, "agent proxy")
        self.gconfig, self.tokenizer = gconfig, tokenizer
        self.n_episodes, self.turn_discount, self.model = int(n_episodes), turn_discount, model
        self.metrics = list(metrics or [])
        # one INFO line per rollout and per model call otherwise (verifiers' rollouts, its
        # interception server's access log)
        for name in ("verifiers", "aiohttp.access"):
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)
        self._started: tuple[Any, str] | None = None  # (proxy, its URL), on the rollout loop
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock: asyncio.Lock | None = None

    async def _start(self, engine: GenerateEngine) -> tuple[Any, str]:
        """The proxy (served over HTTP: the harness program calls it from its own process)
        and the environment's serving resources, once, on the rollout loop."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._started is None:
                proxy = self.proxy_cls(engine, self.tokenizer, self.gconfig,
                                       turn_discount=self.turn_discount, model_name=self.model)
                url = await proxy.serve()
                self._stack = contextlib.AsyncExitStack()
                await self._stack.enter_async_context(self.env.serving())
                self._stack.push_async_callback(proxy.stop)
                self._started = (proxy, url)
        return self._started

    async def aclose(self) -> None:
        """Stop the environment's serving resources and the proxy (tests, shutdown)."""
        if self._stack is not None:
            await self._stack.aclose()
        self._stack, self._started = None, None

    def task(self, row: dict[str, Any]) -> Any:
        """A data row (a ``TaskData`` dump) -> the taskset's ``Task``, as ``EnvServer`` does."""
        return self.task_cls(self.data_cls.model_validate(row), self.config.taskset.task)

    async def episode(self, engine: GenerateEngine, task: Any) -> tuple[Any, Any]:
        """One episode of ``task`` with its model calls answered through a fresh proxy
        session: (the verifiers ``Episode``, the ``AgentSession``), the session rewarded."""
        proxy, url = await self._start(engine)
        session = proxy.start_session()
        # the proxy takes any key: an unset variable makes verifiers send "EMPTY"
        client = self.vf.EvalClientConfig(base_url=f"{url}/sessions/{session.session_id}/v1",
                                          api_key_var="AREALITE_PROXY_KEY")
        sampling = self.vf.SamplingConfig(max_tokens=self.gconfig.max_new_tokens)
        ctx = self.vf.ModelContext(model=self.model, client=client, sampling=sampling)
        try:
            (slot,) = self.env.slots(task, 1)
            ep = await self.env.run_slot(slot, ctx)
        finally:
            proxy.end_session(session.session_id)
        if not ep.ok:
            errs = [e for t in ep.traces for e in t.errors] + list(ep.errors)
            first = f"{errs[0].type}: {errs[0].message}" if errs else "no error recorded"
            raise VerifiersEpisodeError(f"verifiers episode of task {task.key} failed: {first}")
        traces = [t for t in ep.traces if t.agent.trainable]
        # a call that failed and was retried (the trace keeps it, with its error) produced no
        # reply the episode used, and the session recorded no turn for it
        calls = sum(1 for t in ep.traces for c in t.calls if c.error is None)
        if calls != len(session.turns):
            raise VerifiersEpisodeError(
                f"the episode's traces made {calls} model calls that answered but the proxy "
                f"session recorded {len(session.turns)}: a call bypassed the policy's servers")
        if session.turns:
            session.set_reward(sum(t.reward for t in traces) / max(1, len(traces)))
        return ep, session

    async def arun_episode(self, engine: GenerateEngine, data: dict[str, Any]) -> TensorDict | None:
        task = self.task(data)
        done = await asyncio.gather(*(self.episode(engine, task) for _ in range(self.n_episodes)))
        done = [(ep, s) for ep, s in done if s.turns]
        if not done:
            return None
        returns = [s.reward for _, s in done]
        mean = sum(returns) / len(returns)
        std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
        rows = []
        for k, (ep, s) in enumerate(done):
            stats = trace_metrics(list(ep.traces), self.metrics)
            for seg_no, row in enumerate(s.rows()):
                rows.append({**row, **stats, "group_baseline": mean, "group_scale": std,
                             "session_index": k, "segment_index": seg_no})
        return pad_sequences_to_tensors(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m workflows.envs.verifiers_env export ENV_JSON OUT [--env-paths DIR ...]
    [--limit N]``: a taskset's tasks as a training JSONL (exit 2 on bad input)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m workflows.envs.verifiers_env")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="write a verifiers taskset's tasks as training rows")
    e.add_argument("env", help="the environment config as JSON (kwargs.env of the workflow)")
    e.add_argument("out", help="the JSONL file to write")
    e.add_argument("--env-paths", nargs="*", default=[], help="folders of environment modules")
    e.add_argument("--limit", type=int, default=None)
    args = p.parse_args(argv)
    try:
        env = json.loads(args.env)
        n = export_tasks(env, args.out, args.limit, args.env_paths)
    except (ValueError, ImportError) as e:  # bad JSON, an unknown taskset, a bad config
        print(f"error: {e}".splitlines()[0], file=sys.stderr)
        return 2
    print(f"wrote {n} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``AgentWorkflow``: train any agent written against the OpenAI client.

The agent is ``async def run(client, data) -> float | None``, named by import path
(``kwargs.agent: "my_pkg.my_agent:run"``). For each prompt the workflow runs ``n_sessions``
sessions of it concurrently, each with its own proxy client (an ``openai.AsyncOpenAI`` whose
calls the proxy turns into token-level turns, see ``arealite/agent``). A returned number is the
reward of the session's last turn; ``None`` means the agent set its rewards itself
(``POST /sessions/{id}/reward``, or ``session.set_reward``), unrewarded turns counting 0.

The sessions of one prompt form one GRPO group, formed here because a session can yield more
than one row (one per segment, when the chat template is not append-only): every row carries
its session's return as ``rewards`` and the group's mean and std of session returns as
``group_baseline`` / ``group_scale``, which the actor uses instead of grouping consecutive rows.
So train with ``gconfig.n_samples=1`` and ``actor.group_size=1`` (``n_sessions`` is the group).

An agent that raises, outlives ``session_timeout`` seconds, returns something that is not a
finite number or None, or returns a reward without having made a call, fails the episode with
an ``AgentError`` naming the agent and the session (the executor counts and logs it, and draws
the prompt again). The workflow depends on ``arealite.api`` only: the proxy class is found by
import path too (``proxy``, which the config names: ``configs/toy_agent_grpo.yaml`` gives
arealite's ``AgentProxy``).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from typing import Any

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.trajectory import TensorDict, pad_sequences_to_tensors
from arealite.api.workflow_api import GenerateEngine, RolloutWorkflow
from arealite.api.workflow_factory import import_by_path


class AgentError(RuntimeError):
    """The agent misbehaved: raised, timed out, or returned something that is not a reward."""


class AgentWorkflow(RolloutWorkflow):
    def __init__(
        self,
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        *,
        agent: str,
        proxy: str,
        n_sessions: int = 4,
        session_timeout: float = 300.0,
        turn_discount: float = 1.0,
        agent_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if gconfig.n_samples != 1:
            raise ValueError("AgentWorkflow groups sessions itself: set gconfig.n_samples=1 (and "
                             "actor.group_size=1) and the group size with kwargs.n_sessions")
        if n_sessions < 1:
            raise ValueError("n_sessions must be >= 1")
        if not session_timeout > 0:
            raise ValueError("session_timeout must be > 0 seconds")
        self.agent_path = agent
        self.agent = import_by_path(agent, "agent")
        if not inspect.iscoroutinefunction(self.agent):
            raise TypeError(f"agent {agent!r} must be an `async def run(client, data)` function")
        self.proxy_cls = import_by_path(proxy, "agent proxy")
        self.gconfig, self.tokenizer = gconfig, tokenizer
        self.n_sessions, self.session_timeout = int(n_sessions), float(session_timeout)
        self.turn_discount = float(turn_discount)
        self.agent_kwargs = dict(agent_kwargs or {})

    async def _session(self, proxy: Any, data: dict[str, Any], i: int) -> Any:
        session = proxy.start_session()
        client = proxy.client(session)
        where = f"agent {self.agent_path!r} (session {i}, {session.session_id})"
        try:
            result = await asyncio.wait_for(self.agent(client, dict(data), **self.agent_kwargs),
                                            self.session_timeout)
        except asyncio.TimeoutError:
            raise AgentError(f"{where} did not finish within {self.session_timeout:g}s "
                             f"({len(session.turns)} turns made)") from None
        except Exception as e:
            raise AgentError(f"{where} raised {type(e).__name__}: {e}") from e
        finally:
            proxy.end_session(session.session_id)
            await client.close()
        if result is not None:
            if isinstance(result, bool) or not isinstance(result, (int, float)) \
                    or not math.isfinite(result):
                raise AgentError(f"{where} returned {result!r} ({type(result).__name__}); "
                                 "expected a finite number (the reward) or None")
            if not session.turns:
                raise AgentError(f"{where} returned a reward but made no chat call through "
                                 "the client it was given")
            session.set_reward(float(result))
        return session

    async def arun_episode(self, engine: GenerateEngine, data: dict[str, Any]) -> TensorDict | None:
        proxy = self.proxy_cls(engine, self.tokenizer, self.gconfig,
                               turn_discount=self.turn_discount)
        sessions = await asyncio.gather(*(self._session(proxy, data, i)
                                          for i in range(self.n_sessions)))
        sessions = [s for s in sessions if s.turns]
        if not sessions:
            return None
        returns = [s.reward for s in sessions]
        mean = sum(returns) / len(returns)
        std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
        rows = []
        for k, s in enumerate(sessions):
            for seg_no, row in enumerate(s.rows()):
                rows.append({**row, "group_baseline": mean, "group_scale": std,
                             "session_index": k, "segment_index": seg_no})
        return pad_sequences_to_tensors(rows)

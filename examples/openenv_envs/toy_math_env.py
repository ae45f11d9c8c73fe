"""An OpenEnv environment on the toy arithmetic task, written with OpenEnv's own server API
(``openenv.core``: an ``Environment`` with typed ``Action``/``Observation`` models, served by
``create_app`` over HTTP and WebSocket), as the environment ``openenv init`` scaffolds is.

``reset(index=k)`` poses row ``k`` of a toy_math JSONL file (``arealite.demo.toy_math``'s rows,
``{"id", "question", "answer": "... #### N"}``; the file is ``$TOY_MATH_PATH``) as the
observation's ``question``; ``step(ToyMathAction(message=reply))`` ends the episode with
reward 1.0 when the reply's first ``#### N`` is the row's ``N`` (arealite's ``toy_reward``
rule), else 0.0. Serve it with ``uvicorn toy_math_env:app`` from this folder (the workflow's
``app`` mode does exactly that).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

_ANSWER = re.compile(r"####\s*(-?\d+)")


def final_number(text: str) -> str | None:
    m = _ANSWER.search(text or "")
    return m.group(1) if m else None


class ToyMathAction(Action):
    message: str = Field(..., description="The model's reply to the question")


class ToyMathObservation(Observation):
    question: str = Field(default="", description="The question to answer")
    answer: str = Field(default="", description="The right answer, shown once the episode is done")


def _rows() -> list[dict[str, Any]]:
    path = os.environ.get("TOY_MATH_PATH", "")
    if not path:
        raise ValueError("TOY_MATH_PATH: the toy_math JSONL file the environment poses")
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


class ToyMathEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True  # one instance per WebSocket session, no shared state

    def __init__(self) -> None:
        self._rows = _rows()
        self._row: dict[str, Any] | None = None
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
              index: int = 0, **kwargs: Any) -> ToyMathObservation:
        if not 0 <= int(index) < len(self._rows):
            raise ValueError(f"index {index} is outside the task's {len(self._rows)} rows")
        self._row = self._rows[int(index)]
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return ToyMathObservation(question=self._row["question"], done=False, reward=0.0)

    def step(self, action: ToyMathAction, **kwargs: Any) -> ToyMathObservation:  # type: ignore[override]
        if self._row is None:
            raise RuntimeError("step before reset")
        self._state.step_count += 1
        gold = final_number(self._row["answer"])
        pred = final_number(action.message)
        return ToyMathObservation(question=self._row["question"], answer=self._row["answer"],
                                  done=True, reward=float(pred is not None and pred == gold))

    @property
    def state(self) -> State:
        return self._state


app = create_app(ToyMathEnvironment, ToyMathAction, ToyMathObservation, env_name="toy_math",
                 max_concurrent_envs=64)

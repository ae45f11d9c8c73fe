"""One agent run as the proxy records it: turns (one per chat call), grouped into segments.

A **segment** is one token sequence the trainer can train on as a row: the first turn's prompt,
then for each further turn the tokens that turn appended (tool results, user messages; loss
mask 0, version -1) and the tokens it generated (loss mask 1, the server's logprobs and
per-token weight versions). A turn joins the latest segment whose conversation it continues
(same tools, earlier messages unchanged, the assistant replies the ones the proxy returned) and
whose rendering the chat template only appends to; otherwise it opens a new segment (a
template that re-renders history, such as Qwen3 dropping earlier ``<think>`` blocks, or an
agent that rewrote its history). Earlier generated tokens are never re-tokenized.

**Rewards** attach to turns (``set_reward(r)`` to the last turn, ``set_reward(r, turn=i)`` or a
completion id to a given one). With turn discount γ, turn t's return is
``G_t = r_t + γ·G_{t+1}``; the session's reward is ``G_0``, and a segment's reward is the return
at its first turn (so a final reward R after T turns gives ``γ^(T-1)·R`` to a one-segment
session, as ``MultiTurnWorkflow`` does). All segments of a session stay in the session's group
(see ``workflows/agent.py``): they share its group baseline and are never separate samples.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from arealite.api.trajectory import ROUTED_EXPERTS, routed_experts_row


@dataclass
class Turn:
    """One chat call: the exact prompt and completion token ids, as generated."""

    completion_id: str
    segment: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    reward: float | None = None


@dataclass
class Segment:
    tokens: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    messages: list[dict[str, Any]]  # the conversation so far, this segment's replies included
    tools_key: str
    turns: list[int] = field(default_factory=list)
    rendered: str = ""  # the template's rendering of ``messages`` (append-only check)
    # a MoE server's routing of ``tokens[:-1]`` (each turn adds the rows past earlier turns')
    routed: Any = None


class SessionError(RuntimeError):
    pass


@dataclass
class AgentSession:
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    turn_discount: float = 1.0
    turns: list[Turn] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    ended: bool = False
    # Responses API, for ``previous_response_id``: response id -> (the response it continued,
    # the messages it added) (``arealite.agent.responses_api.Stored``)
    stored_responses: dict[str, tuple[str | None, list[dict[str, Any]]]] = field(
        default_factory=dict
    )

    def check_open(self) -> None:
        if self.ended:
            raise SessionError(f"session {self.session_id} has ended")

    def set_reward(self, reward: float, turn: int | str | None = None) -> None:
        """Reward the last turn (``turn=None``), turn number ``turn``, or the turn whose
        completion id is ``turn``. Setting it twice replaces it."""
        if (
            isinstance(reward, bool)
            or not isinstance(reward, (int, float))
            or not math.isfinite(reward)
        ):
            raise SessionError(f"a reward must be a finite number, got {reward!r}")
        if not self.turns:
            raise SessionError(f"session {self.session_id} has no turn to reward")
        if turn is None:
            t = self.turns[-1]
        elif isinstance(turn, str):
            found = [x for x in self.turns if x.completion_id == turn]
            if not found:
                raise SessionError(f"session {self.session_id} has no completion {turn!r}")
            t = found[0]
        else:
            if not -len(self.turns) <= turn < len(self.turns):
                raise SessionError(f"turn {turn} out of range ({len(self.turns)} turns)")
            t = self.turns[turn]
        t.reward = float(reward)

    def end(self) -> None:
        self.ended = True

    def returns(self) -> list[float]:
        """``G_t`` for every turn (unrewarded turns count 0)."""
        out = [0.0] * len(self.turns)
        g = 0.0
        for i in range(len(self.turns) - 1, -1, -1):
            g = (self.turns[i].reward or 0.0) + self.turn_discount * g
            out[i] = g
        return out

    @property
    def reward(self) -> float:
        return self.returns()[0] if self.turns else 0.0

    def rows(self) -> list[dict[str, Any]]:
        """One trajectory row per segment (python lists; see ``arealite.api.trajectory``)."""
        g = self.returns()
        rows = []
        for s in self.segments:
            if not s.turns:
                continue
            row = {
                "input_ids": list(s.tokens),
                "loss_mask": list(s.loss_mask),
                "logprobs": list(s.logprobs),
                "versions": list(s.versions),
                "rewards": float(g[s.turns[0]]),
                "num_turns": len(s.turns),
            }
            if s.routed is not None:
                row[ROUTED_EXPERTS] = routed_experts_row(s.routed, len(s.tokens))
            rows.append(row)
        return rows

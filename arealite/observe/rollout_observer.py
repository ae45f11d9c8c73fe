"""What the rollout client and its executor tell an observer, at the points where it happens:
an episode queued, started and ended; a request started, each attempt of it on a server, its
end; a weight push ended; a reward call ended. ``arealite.observe.observers.StepObservers``
attaches one (``RemoteInferenceEngine.set_observer``); the timeline trace
(``arealite.observe.rollout_trace``) is one.

Every method here does nothing, so an observer overrides only what it records. A client with no
observer attached calls none of them: each hook sits behind one ``is None`` check.

What ``on_episode_submitted``, ``on_episode_start`` or ``on_request_start`` returns is the
observer's own record, handed back as it is to the hooks that follow. Episode hooks run in the episode's own task, so a context variable set by ``on_episode_start``
is seen by everything the episode awaits (its requests, its reward calls).
"""

from __future__ import annotations

from typing import Any


class RolloutObserver:
    # ---- episodes (the executor)

    def on_episode_submitted(self) -> Any:
        """An episode was queued (the trainer's thread); returns what ``on_episode_start`` gets."""
        return None

    def on_episode_start(self, submitted: Any) -> Any:
        """The episode queued as ``submitted`` starts running (in its own task, on the loop);
        returns what ``on_episode_end`` gets."""
        return None

    def on_episode_end(self, episode: Any, outcome: str, version: int) -> None:
        """It ended: ``outcome`` is ``accepted``, ``rejected`` (the workflow returned None) or
        ``failed``; ``version`` is the client's weight version at its end."""

    # ---- requests (the client's agenerate)

    def on_request_start(self, rid: str) -> Any:
        """``agenerate`` started request ``rid``; returns what the request's other hooks get."""
        return None

    def on_request_attempt(self, request: Any, addr: str, start: float, ok: bool) -> None:
        """One attempt of ``request`` on server ``addr`` ended now (``time.perf_counter``),
        begun at ``start``: a segment it answered (``ok``), or a failure retried elsewhere."""

    def on_request_end(self, request: Any, outcome: str) -> None:
        """``request`` ended now: its stop reason, or ``error``."""

    # ---- weight pushes and reward calls

    def on_weight_update(self, meta: Any, start: float, end: float, ok: bool,
                         report: Any) -> None:
        """A weight push to ``meta.version`` ran from ``start`` to ``end``; ``report`` is the
        client's last successful ``WeightUpdateReport`` (this one's, when ``ok``)."""

    def on_reward_call(self, name: str, start: float, end: float, ok: bool) -> None:
        """A reward function ``name`` ran (``arealite.api.reward_api.observe_reward_call``)."""

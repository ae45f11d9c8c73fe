from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def reward_pool_session():
    """One shared pool for the whole test session (workers are slow to spawn on 2 cores)."""
    from workflows.reward_pool import get_reward_pool, shutdown_reward_pool

    pool = get_reward_pool()
    yield pool
    shutdown_reward_pool()

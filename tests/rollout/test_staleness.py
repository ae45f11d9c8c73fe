"""The staleness gate: the capacity formula, restart safety, and (hypothesis) that no consumed
trajectory is more than η versions older than the trainer, whatever the completion order."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from arealite.rollout.staleness import StalenessManager


def test_capacity_formula_and_concurrency_bound():
    g = StalenessManager(max_concurrent=3, consumer_batch_size=4, max_staleness=1)
    assert g.capacity() == 3  # min(3 - 0, (1 + 0 + 1) * 4 - 0)
    for _ in range(3):
        assert g.try_start()
    assert not g.try_start()  # concurrency bound
    g.on_accept()
    g.on_accept()
    assert g.capacity() == min(3 - 1, 8 - (2 + 1))
    assert g.try_start() and g.try_start()
    g.on_reject()
    g.on_fail()
    g.on_accept()
    s = g.stat()
    assert (s.running, s.accepted, s.rejected, s.failed) == (0, 3, 1, 1)
    assert g.capacity() == min(3, 8 - 3)


def test_per_rank_split():
    g = StalenessManager.per_rank(max_concurrent=16, consumer_batch_size=8, max_staleness=2, dp_size=4)
    assert (g.max_concurrent, g.batch_size, g.max_staleness) == (4, 2, 2)
    g = StalenessManager.per_rank(None, 8, 0, dp_size=1)
    assert g.max_concurrent == 8
    with pytest.raises(ValueError):
        StalenessManager.per_rank(4, 4, 0, dp_size=0)
    with pytest.raises(ValueError):
        StalenessManager(0, 4, 0)


@pytest.mark.parametrize("eta", [0, 1, 3])
def test_restart_restores_the_budget(eta):
    b = 4
    g = StalenessManager(max_concurrent=100, consumer_batch_size=b, max_staleness=eta)
    g.on_version_recovered(5)
    assert g.version == 5
    assert g.capacity() == (eta + 1) * b  # not (eta + 6) * b: 5 batches were consumed already
    assert g.stat().accepted == 5 * b


def test_stale_check():
    g = StalenessManager(4, 4, max_staleness=1)
    g.set_version(3)
    assert not g.is_stale(2)
    assert g.is_stale(1)
    assert not g.is_stale(1, version=2)


# --------------------------------------------------------------------------- property test

ops = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(1, 4)),
        # which running episode finishes, counted from the newest: out-of-order completion
        st.tuples(st.just("finish"), st.integers(0, 3), st.sampled_from(["ok", "ok", "none", "err"])),
        st.tuples(st.just("consume"), st.just(0)),
        st.tuples(st.just("restart"), st.just(0)),
    ),
    max_size=80,
)

# The shortest schedule where the gate alone is not enough (η=1, B=1): e and f start at v0, f
# is consumed at v0, g starts and is consumed at v1, e finishes last and would be consumed at v2.
OUT_OF_ORDER = [
    ("start", 2), ("finish", 0, "ok"), ("consume", 0), ("start", 1), ("finish", 0, "ok"),
    ("consume", 0), ("finish", 0, "ok"), ("consume", 0),
]


@settings(max_examples=300, deadline=None)
@example(eta=1, b=1, m=12, script=OUT_OF_ORDER, reject_rate=0)
@given(
    eta=st.integers(0, 3),
    b=st.integers(1, 4),
    m=st.integers(1, 12),
    script=ops,
    reject_rate=st.integers(0, 3),
)
def test_gate_invariants_under_random_schedules(eta, b, m, script, reject_rate):
    """A model of the executor and trainer: episodes start through the gate, finish in any
    order (accepted, rejected or failed); the trainer consumes B fresh trajectories (dropping
    stale ones, as the executor does) and bumps the version; a restart recovers the version.
    Invariants: running <= M, accepted + running <= (η + v + 1)·B after every admission, every
    consumed trajectory started at most η versions ago, counters add up."""
    g = StalenessManager(m, b, eta)
    running: list[int] = []  # start versions
    ready: deque[int] = deque()
    n_accept = n_reject = n_fail = n_drop = 0
    for step, op in enumerate(script):
        kind = op[0]
        if kind == "start":
            for _ in range(op[1]):
                if not g.try_start():
                    break
                running.append(g.version)
                s = g.stat()
                assert s.running <= m
                assert s.accepted + s.running <= (eta + g.version + 1) * b
        elif kind == "finish" and running:
            v0 = running.pop(-1 - op[1] % len(running))
            outcome = op[2] if reject_rate else "ok"
            if outcome == "ok":
                g.on_accept()
                ready.append(v0)
                n_accept += 1
            elif outcome == "none":
                g.on_reject()
                n_reject += 1
            else:
                g.on_fail()
                n_fail += 1
        elif kind == "consume":
            batch = []
            while ready and len(batch) < b:
                v0 = ready.popleft()
                if g.is_stale(v0):
                    g.on_drop_accepted()
                    n_drop += 1
                else:
                    batch.append(v0)
            if len(batch) < b:  # not enough yet: put back, as wait() does on timeout
                ready.extendleft(reversed(batch))
                continue
            for v0 in batch:
                assert g.version - v0 <= eta, (step, g.version, v0)
            g.set_version(g.version + 1)
        elif kind == "restart":
            # a crash loses running and unconsumed work; the trainer resumes at its version
            running.clear()
            ready.clear()
            g.on_version_recovered(g.version)
            n_accept = n_reject = n_fail = n_drop = 0
            continue
        s = g.stat()
        assert s.running == len(running)
        assert s.rejected == n_reject + n_drop
        assert s.failed == n_fail
        assert g.capacity() <= m - len(running)


def test_gate_never_starves_a_trainer():
    """Liveness: with every episode accepted, a trainer consuming B per version always finds
    B trajectories (the gate reopens as the version moves)."""
    for eta in range(3):
        g = StalenessManager(max_concurrent=5, consumer_batch_size=3, max_staleness=eta)
        ready: deque[int] = deque()
        for _ in range(20):
            while len(ready) < 3:
                assert g.try_start(), "gate closed while the trainer waits for a batch"
                g.on_accept()
                ready.append(g.version)
            for _ in range(3):
                assert g.version - ready.popleft() <= eta
            g.set_version(g.version + 1)


def test_take_oldest_consumes_the_oldest_starts_first():
    from types import SimpleNamespace as R

    import torch

    from arealite.rollout.staleness import generated_tokens, take_oldest

    q = deque([R(group=None, start_version=v, i=i) for i, v in enumerate([3, 1, 2, 1, 3])])
    q.append(R(group=7, start_version=0, i=5))  # another caller's group: never taken here
    taken, rest = take_oldest(q, None, 3)
    assert [r.i for r in taken] == [1, 2, 3]  # versions 1, 2, 1, in queue order
    assert [r.i for r in rest] == [0, 4, 5]
    taken, rest = take_oldest(rest, None, None)
    assert [r.i for r in taken] == [0, 4] and [r.i for r in rest] == [5]
    assert generated_tokens({"loss_mask": torch.tensor([[0, 1, 1], [1, 0, 0]])}) == 3
    assert generated_tokens({}) == 0

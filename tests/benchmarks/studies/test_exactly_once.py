"""benchmarks/studies/exactly_once.py: the kill plan replays from its seed, and the ledger
checks flag each way a run can lose or repeat data (a clean ledger passes). The killed runs
themselves are in tests/trainer/test_recovery.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from benchmarks.studies import exactly_once as eo

ROWS = 8  # rows an epoch (BATCH a step)


def test_kill_plan_replays_from_its_seed():
    a = eo.plan_kills(11, 20, first=eo.TARGETS)
    assert a == eo.plan_kills(11, 20, first=eo.TARGETS)
    assert a != eo.plan_kills(12, 20, first=eo.TARGETS)
    assert [k.target for k in a[:3]] == list(eo.TARGETS)
    assert {k.phase for k in a} == set(eo.PHASES)
    assert all(k.phase in ("rollout", "push") for k in a if k.target == "server")
    assert all(1 <= k.gap <= 3 and 0 <= k.frac <= 1 for k in a)


def _write(rdir: Path, ledger: list[dict], end: list, metrics: list[dict]) -> None:
    logs = rdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "sample_ids.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ledger))
    (logs / "sample_ids_end.json").write_text(json.dumps(end))
    (logs / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in metrics))


def _clean_run(n_rows: int, steps: int, seed: int = 0) -> tuple[list[dict], list, list[dict]]:
    """An async run that reads ahead: each epoch's rows in a shuffled order, one row dropped
    (stale) in epoch 0, the rest trained in steps of BATCH, the last rows in flight."""
    rng = random.Random(seed)
    queue = []
    for e in range(steps * eo.BATCH // n_rows + 2):
        perm = list(range(n_rows))
        rng.shuffle(perm)
        queue += [(e, r) for r in perm]
    dropped = queue.pop(3)
    ledger, metrics, ep = [], [], 100
    for s in range(1, steps + 1):
        take, queue = queue[: eo.BATCH], queue[eo.BATCH :]
        line = {"step": s, "version": s, "staleness_max": 1, "ids": [], "episodes": [],
                "epochs": [], "drops": []}
        for e, r in take:
            line["ids"] += [r] * eo.N_SAMPLES
            line["episodes"] += [ep] * eo.N_SAMPLES
            line["epochs"] += [e] * eo.N_SAMPLES
            ep += 3  # serials skip the failed and stale episodes
        if s == 2:
            line["drops"] = [{"id": dropped[1], "epoch": dropped[0], "reason": "stale",
                              "attempts": 4}]
        ledger.append(line)
        metrics.append({"step": s, "rollout/episodes": ep, "rollout/stale": s,
                        "rollout/redrawn": s, "rollout/dropped": float(s >= 2)})
    # the reader's rows in flight: what it took from the epoch being read
    e_last = ledger[-1]["epochs"][-1]
    end = [[r, e] for e, r in queue if e == e_last][: 2]
    return ledger, end, metrics


def _check(tmp_path: Path, ledger, end, metrics, mode: str = "async", order=None) -> list[str]:
    rdir = tmp_path / "toy-grpo" / "t"
    _write(rdir, ledger, end, metrics)
    return eo.check_run(rdir, mode, len(ledger), 1, ROWS, order)["violations"]


def test_a_clean_ledger_passes(tmp_path):
    ledger, end, metrics = _clean_run(ROWS, 10)
    assert _check(tmp_path, ledger, end, metrics) == []


@pytest.mark.parametrize("corrupt, message", [
    ("twice", "trained"), ("lost", "never trained or dropped"), ("episode", "episode"),
    ("version", "version"), ("counter", "went back"), ("drops", "rollout/dropped"),
    ("stale", "staleness"), ("gap", "ledger steps"),
])
def test_each_corruption_is_flagged(tmp_path, corrupt, message):
    ledger, end, metrics = _clean_run(ROWS, 10)
    first, second = ledger[0], ledger[1]
    if corrupt == "twice":  # a row of epoch 0 trained again in a later step
        second["ids"][:2] = first["ids"][:2]
        second["epochs"][:2] = first["epochs"][:2]
    elif corrupt == "lost":  # a step's episode vanished and a replacement came from nowhere
        first["ids"][:2] = [ROWS + 5] * 2
    elif corrupt == "episode":  # one episode in two steps
        second["episodes"][:2] = first["episodes"][:2]
    elif corrupt == "version":
        second["version"] = 3
    elif corrupt == "counter":
        metrics[5]["rollout/stale"] = 0
    elif corrupt == "drops":
        second["drops"] = []
    elif corrupt == "stale":
        second["staleness_max"] = 2
    elif corrupt == "gap":
        del ledger[4]
    assert any(message in v for v in _check(tmp_path, ledger, end, metrics)), corrupt


def test_sync_mode_checks_each_step_against_the_loader_order(tmp_path):
    order = [[0, 1, 2, 3], [4, 5, 6, 7]]
    ledger = []
    for s, rows in enumerate(order, 1):
        ledger.append({"step": s, "version": s, "staleness_max": 0, "drops": [],
                       "ids": [r for r in rows for _ in range(eo.N_SAMPLES)],
                       "episodes": [10 * s + i for i in range(eo.BATCH) for _ in range(eo.N_SAMPLES)],
                       "epochs": [0] * eo.BATCH * eo.N_SAMPLES})
    metrics = [{"step": s} for s in (1, 2)]
    assert _check(tmp_path, ledger, [], metrics, "sync", order) == []
    ledger[1]["ids"][:2] = [8, 8]  # a row of a later step trained early
    assert any("uninterrupted order" in v for v in _check(tmp_path, ledger, [], metrics, "sync", order))

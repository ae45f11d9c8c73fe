"""A short GRPO run over the launcher with the trainer's /metrics and the trace on: the
launcher's scrape config names every server and trainer rank, every target's /metrics parses
with prometheus_client's own parser and its counters move as steps pass, and the trace nests
(segments inside their request, requests inside their episode, phases inside their step) with
step lengths equal to the logged step times. The run also has a reward-model pool started by
the launcher (``launcher.reward_model_servers``): the trainer's workflow scores through it while
it runs, and it is stopped with the rest. Started as a user starts a run (``arealite train``),
it also checks the held-out evaluation's fields (not a learning figure), the kept held-out
completions and the end-of-run summary that names them."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import psutil
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from arealite.observe.trace import load_trace
from arealite.utils.network import find_free_port
from benchmarks.harness.grpo_runs import (
    launcher_cmd,
    metrics,
    run_dir,
    small_run,
    wait_exit,
    wait_until,
)
from tests.support.procs import spawn

pytestmark = pytest.mark.integration
STEPS = 10  # room for two steps after the first scrape (see below)
TRIAL = "obs"
TRAINER_NAMES = ("arealite_trainer_steps", "arealite_trainer_phase_seconds", "arealite_rollout_idle_seconds",
                 "arealite_trainer_tokens", "arealite_trainer_reward", "arealite_trainer_staleness_avg",
                 "arealite_trainer_staleness_fraction", "arealite_weight_sync_bytes",
                 "arealite_weight_update_seconds", "arealite_rollout_episodes", "arealite_rollout_queue",
                 "arealite_client_inflight_requests", "arealite_client_server_healthy",
                 "arealite_client_served_requests")


def scrape(target: str) -> dict[str, list]:
    text = requests.get(f"http://{target}/metrics", timeout=5).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(fams: dict[str, list], sample: str, **labels: str) -> float:
    return sum(s.value for fam in fams.values() for s in fam
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def rm_pool(log: str) -> list[str]:
    """The reward-model servers' addresses, as the launcher announced them."""
    m = re.search(r"reward-model servers ready: AREAL_RM_SERVER_ADDRS=(\S+)", Path(log).read_text())
    return m.group(1).split(",") if m else []


def score_forwards(addr: str) -> int:
    info = requests.get(f"http://{addr}/server_info", timeout=5).json()
    return info["internal_states"][0].get("score_forwards", 0)


def test_metrics_and_trace_of_a_short_run(tmp_path, tiny_model_dir, toy_data_dir,
                                          tiny_reward_model_dir):
    port = find_free_port()
    run = [o for o in small_run(tiny_model_dir, toy_data_dir, STEPS, epochs=4)
           if o not in ("valid_dataset=null", "evaluator.freq_steps=null")]
    over = [*run, f"valid_dataset.path={toy_data_dir / 'valid.jsonl'}", "evaluator.freq_steps=3",
            "evaluator.max_prompts=8", "evaluator.pass_k=2", "stats_logger.trace=true",
            f"stats_logger.metrics_port={port}", "servers.enable_metrics=true",
            # the launcher's reward-model pool, scored through by the training workflow
            f"launcher.reward_model_servers.model_path={tiny_reward_model_dir}",
            "launcher.reward_model_servers.dtype=float32", "reward_model={}",
            "workflow.kwargs.reward_model_combine={mode: sum, model_weight: 0.5}"]
    cfg = run_dir(tmp_path, TRIAL) / "prometheus.yml"
    # `arealite train`: the launcher's command line, then the end-of-run summary
    cmd = [sys.executable, "-m", "arealite.cli.main", "train",
           *launcher_cmd("configs/toy_grpo.yaml", tmp_path, TRIAL, over)[3:]]
    with spawn(cmd) as (proc, log):
        def step() -> int:
            rows = [r["step"] for r in metrics(tmp_path, TRIAL)]
            return max(rows, default=0)

        wait_until(lambda: step() >= 2, proc, log, 240, "step 2")
        text = cfg.read_text()
        servers = re.search(r"job_name: servers\n.*\n.*targets: \[(.*)\]", text).group(1)
        targets = [t.strip(" '") for t in servers.split(",")] + [f"127.0.0.1:{port}"]
        assert f"'127.0.0.1:{port}'" in text and len(targets) == 2
        first = {t: scrape(t) for t in targets}
        # metrics.jsonl can lag the live counters by a few steps: wait on the counter itself.
        # The server was scraped first and may already hold version done + 1 (pushed before the
        # trainer counts step done + 1), so only step done + 2 surely pushed after that scrape.
        done = value(first[targets[1]], "arealite_trainer_steps_total")
        wait_until(lambda: value(scrape(targets[1]), "arealite_trainer_steps_total") >= done + 2,
                   proc, log, 240, "two steps after the first scrape")
        later = {t: scrape(t) for t in targets}
        (rm_addr,) = rm_pool(log)
        assert score_forwards(rm_addr) > 0  # the workflow scored through the launcher's pool
        rm_server = next(c for c in psutil.Process(proc.pid).children(recursive=True)
                         if "--is-embedding" in c.cmdline())
        assert wait_exit(proc, log, 240) == 0
        out = Path(log).read_text()
    psutil.wait_procs([rm_server], timeout=10)
    assert not rm_server.is_running()  # stopped with everything else

    server, trainer = targets
    for name in TRAINER_NAMES + ("arealite_trainer_eval_accuracy",):
        assert name in later[trainer], name
    t0, t1 = first[trainer], later[trainer]
    assert 0.0 <= value(t1, "arealite_trainer_eval_accuracy") <= 1.0
    assert value(t1, "arealite_trainer_steps_total") > value(t0, "arealite_trainer_steps_total") >= 1
    assert (value(t1, "arealite_rollout_episodes_total", outcome="accepted")
            > value(t0, "arealite_rollout_episodes_total", outcome="accepted"))
    # record_step counts the step, then observes its phases: a scrape may fall between the two
    n = value(t1, "arealite_trainer_steps_total")
    assert n - 1 <= value(t1, "arealite_trainer_phase_seconds_count", phase="update") <= n
    assert value(t1, "arealite_weight_sync_bytes_total") > value(t0, "arealite_weight_sync_bytes_total") > 0
    assert value(t1, "arealite_client_served_requests_total") > value(t0, "arealite_client_served_requests_total")
    s0, s1 = first[server], later[server]
    assert (value(s1, "sglang:generation_tokens_total") > value(s0, "sglang:generation_tokens_total") > 0)
    # version `done` went out before step done+1 finished, and s1 was scraped after that
    assert value(s1, "arealite:weight_version") >= done >= 1
    assert value(s1, "arealite:weight_updates_total") > value(s0, "arealite:weight_updates_total")

    check_trace(run_dir(tmp_path, TRIAL) / "logs" / "trace_rank0.json",
                [r for r in metrics(tmp_path, TRIAL) if r["step"] >= 1])
    check_heldout(tmp_path, out)


def check_heldout(fileroot: Path, out: str) -> None:
    """The default evaluation's fields at steps 0, 3, 6, 9 and the last, each a share in
    [0, 1] with exact <= right and exact <= format; its rows kept and named in the summary."""
    evals = [r for r in metrics(fileroot, TRIAL) if "eval/right" in r]
    assert [r["step"] for r in evals] == [0, 3, 6, 9, STEPS]
    for r in evals:
        assert r["eval/n"] == 8.0 and "eval/accuracy" not in r  # the mean reward is eval/score
        for k in ("right", "exact", "format", "score", "majority_share", "gold_majority_share",
                  "pass@2", "pass@2_exact"):
            assert 0.0 <= r[f"eval/{k}"] <= 1.0, (k, r)
        assert r["eval/exact"] <= min(r["eval/right"], r["eval/format"])
        assert r["eval/collapse"] in (0.0, 1.0) and r["eval/pass@2_rows"] == 8.0
    kept = run_dir(fileroot, TRIAL) / "logs" / "heldout_completions.jsonl"
    rows = [json.loads(line) for line in kept.read_text().splitlines()]
    assert len(rows) == 8 * len(evals) and sorted({r["step"] for r in rows}) == [0, 3, 6, 9, STEPS]
    assert {"prompt", "reply", "gold", "right", "exact", "format", "score"} <= set(rows[0])
    assert f"held-out completions: {kept}" in out and "last held-out evaluation, step 10: right" in out
    assert "held-out (step 0) best" in out


def check_trace(path: Path, rows: list[dict]) -> None:
    events = [e for e in load_trace(path) if e["ph"] == "X"]
    end = {id(e): e["ts"] + e["dur"] for e in events}

    def inside(child: dict, parent: dict, slack_us: float = 1.0) -> bool:
        return parent["ts"] - slack_us <= child["ts"] and end[id(child)] <= end[id(parent)] + slack_us

    steps = [e for e in events if e["cat"] == "step"]
    assert [e["args"]["step"] for e in steps] == list(range(1, STEPS + 1))
    logged = {r["step"]: r["timeperf/step"] for r in rows}
    phases = [e for e in events if e["cat"] == "timeperf"]
    evals = [p for p in phases if p["name"] == "eval"]
    for e in steps:  # the step span less its evaluation is the logged step time (evaluation
        # is excluded from timeperf/step), to the microsecond's rounding
        inner = sum(p["dur"] for p in evals if inside(p, e)) / 1e6
        assert abs(e["args"]["eval_seconds"] - inner) < 0.003
        assert abs(e["dur"] / 1e6 - inner - logged[e["args"]["step"]]) < 0.003
    for name in ("rollout_wait", "logp", "update", "weight_sync"):
        assert sum(p["name"] == name for p in phases) >= STEPS, name
    assert evals and all(any(inside(p, s) for s in steps) for p in evals if p["ts"] > steps[0]["ts"])
    for p in phases:  # each phase lies inside the step it overlaps
        hosts = [s for s in steps if s["ts"] < end[id(p)] and p["ts"] < end[id(s)]]
        if hosts:
            assert len(hosts) == 1 and inside(p, hosts[0]), (p, hosts)
    episodes = {e["args"]["id"]: e for e in events if e["cat"] == "episode"}
    assert len(episodes) >= STEPS * 4
    requests_ = [e for e in events if e["cat"] == "request"]
    segs = [e for e in events if e["cat"] in ("generate", "pause")]
    assert requests_ and segs and any(e["cat"] == "reward" for e in events)
    for e in requests_ + segs + [e for e in events if e["cat"] in ("reward", "queue")]:
        ep = e["args"]["episode"]
        if ep in episodes:
            assert inside(e, episodes[ep]), e
        else:  # an episode still running when the trace closed (the run's last step)
            assert end[id(e)] > steps[-1]["ts"], e
    by_rid = {r["args"]["rid"]: r for r in requests_}
    for s in segs:
        r = by_rid[s["args"]["rid"]]
        assert s["tid"] == r["tid"] and inside(s, r), (s, r)
    for lane in {e["tid"] for e in events}:  # spans of one lane nest or are disjoint
        spans = sorted((e for e in events if e["tid"] == lane), key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in spans:
            while stack and end[id(stack[-1])] <= e["ts"] + 1.0:
                stack.pop()
            assert not stack or end[id(e)] <= end[id(stack[-1])] + 1.0, (stack[-1], e)
            stack.append(e)
    pushes = [e for e in events if e["cat"] == "weight_push"]
    assert [e["args"]["version"] for e in pushes] == list(range(1, STEPS + 1))

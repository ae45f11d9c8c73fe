"""Exactly-once across random kills: the toy GRPO job killed again and again, relaunched with
recovery, and its ledger checked over the whole run.

Each kill is drawn from one seed (printed; ``--seed`` replays a failure): its target (the
trainer worker by SIGKILL, the launcher by SIGTERM, one server by SIGKILL), the phase it aims at
(``rollout``: while episodes generate; ``update``: inside the PPO update, timed from the step's
own ``timeperf/*``; ``push``: while a server is paused inside a weight update; ``checkpoint``:
while a recovery checkpoint's ``.tmp-`` folder is being written) and how many steps after the
last resume it comes. A killed trainer is restarted by the launcher; a launcher that exited is
launched again with ``recover.mode=auto``. A server is killed at most once per launcher (two
servers, ``launcher.max_server_failures=1``).

The checks (``check_run``), over the ledger (``logs/sample_ids.jsonl``, one line per step with
the rows, episodes and drops it trained: ``arealite/observe/sample_log.py``), the metrics and the
recovery folder:

- steps 1..N each logged once, at weight version = step, staleness within η;
- no episode trained twice (the executor's serial numbers, kept across restarts);
- every row of each epoch trained exactly once, or dropped after its retries (reason counted),
  or, in the epochs still being read at the end, in flight; the drops in the ledger equal the
  run's ``rollout/dropped`` counter;
- ``rollout/{episodes,stale,redrawn,dropped}`` never go back (counters continue across restarts);
- sync mode: each step trains the rows the uninterrupted loader hands out for it, in order of
  epochs (the reference order is the loader's own, which an uninterrupted sync run trains:
  ``tests/trainer/test_recovery.py``); async mode: each finished epoch's multiset is the dataset;
- after every kill, the newest complete checkpoint loads and never goes back to an older step
  (an interrupted write never replaces the last good one).

    python -m benchmarks.studies.exactly_once                    # >= 50 kills, async and sync
    python -m benchmarks.studies.exactly_once --quick            # 3 kills, async (the suite's form)
    python -m benchmarks.studies.exactly_once --seed 7 --kills 3 --modes async   # replay

Results: ``benchmarks/results/exactly_once/exactly_once[_quick].json``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from benchmarks.harness.grpo_runs import (
    catch_paused_server,
    descendants,
    is_server,
    is_trainer_worker,
    last_step,
    launcher_cmd,
    log_tail,
    metrics,
    poll_until,
    run_dir,
    signal_group,
    small_run,
)
from benchmarks.harness.paths import results_dir

TARGETS = ("trainer", "launcher", "server")
PHASES = ("rollout", "update", "push", "checkpoint")
N_ROWS, BATCH, N_SAMPLES = 16, 4, 2  # 4 steps an epoch
SEED = 1  # configs/toy_grpo*.yaml
CONFIGS = {"async": "configs/toy_grpo.yaml", "sync": "configs/toy_grpo_sync.yaml"}


@dataclass
class Kill:
    target: str
    phase: str
    gap: int  # steps after the last resume (or the previous kill) before it comes
    frac: float  # where inside the aimed phase, 0..1


def plan_kills(seed: int, n: int, first: tuple[str, ...] = ()) -> list[Kill]:
    """``n`` kills drawn from ``seed``; ``first`` fixes the targets of the first ones (the short
    form makes sure each target is hit once)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        target = first[i] if i < len(first) else rng.choice(TARGETS)
        phase = rng.choice(("rollout", "push") if target == "server" else PHASES)
        out.append(Kill(target, phase, rng.randint(1, 3), rng.random()))
    return out


@dataclass
class KillRecord:
    target: str
    phase: str
    step: int  # the last logged step when it came
    caught: bool  # the aimed phase was seen (a paused server, a .tmp- checkpoint folder)
    ckpt_step: int | None  # the newest complete checkpoint after it
    note: str = ""


@dataclass
class Run:
    """One run under a launcher that may be killed and launched again."""

    config: str
    fileroot: Path
    trial: str
    over: list[str]
    log_dir: Path
    proc: subprocess.Popen | None = None
    log: str = ""
    launches: int = 0
    servers_killed: int = 0  # in this launcher's life
    logs: list[str] = field(default_factory=list)

    def launch(self) -> None:
        self.launches += 1
        self.log = str(self.log_dir / f"{self.trial}.launch{self.launches}.log")
        self.logs.append(self.log)
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(launcher_cmd(self.config, self.fileroot, self.trial, self.over),
                                         stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        self.servers_killed = 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    @property
    def recover(self) -> Path:
        return run_dir(self.fileroot, self.trial) / "recover"


def _latest_ckpt(root: Path) -> tuple[Path | None, int | None]:
    from arealite.utils.recover import find_latest, load_recover_info

    d = find_latest(root)
    if d is None:
        return None, None
    return d, load_recover_info(d).step + 1  # logged steps are step + 1


def _trainer(run: Run) -> psutil.Process | None:
    ws = descendants(run.proc.pid, is_trainer_worker)
    return ws[0] if ws else None


def strike(run: Run, kill: Kill, rng: random.Random, steps: int, timeout: float) -> KillRecord | None:
    """Wait for the kill's moment and deliver it; None when the run ended first."""
    base = last_step(run.fileroot, run.trial)
    at = min(max(base, 0) + kill.gap, steps - 1)
    # and a checkpoint to resume from: a run killed before its first one starts afresh, which
    # the launcher does not do by itself (and a run folder holding a run may refuse)
    if not poll_until(lambda: last_step(run.fileroot, run.trial) >= at
                      and _latest_ckpt(run.recover)[0] is not None, run.proc, timeout, poll=0.01):
        return None
    step = last_step(run.fileroot, run.trial)
    target = kill.target
    if target == "server" and run.servers_killed >= 1:
        target = "trainer"  # one server per launcher life (max_server_failures=1)
    caught, note = False, ""
    ckpt_dir = run.recover
    victim: psutil.Process | None = None
    if kill.phase == "checkpoint":
        caught = poll_until(lambda: any(ckpt_dir.glob(".tmp-step*")), run.proc, 20, poll=0.002)
    elif kill.phase == "push":
        s = catch_paused_server(run.proc, 20)
        caught = s is not None
        victim = s if caught and target == "server" else None
    elif kill.phase == "update":
        rows = [r for r in metrics(run.fileroot, run.trial) if r.get("step") == step]
        t = rows[-1] if rows else {}
        # the next step: its rollout wait and logp, then this far into its update
        delay = (t.get("timeperf/rollout_wait", 0) + t.get("timeperf/logp", 0)
                 + kill.frac * t.get("timeperf/update", 0.05))
        time.sleep(delay)
        caught = last_step(run.fileroot, run.trial) == step
        note = f"{delay * 1e3:.0f} ms after step {step}"
    else:  # rollout: episodes are generating (async: always; sync: early in the step)
        time.sleep(kill.frac * 0.05)
        caught = True
    if not run.alive():
        return None
    if target == "launcher":
        run.proc.send_signal(signal.SIGTERM)
    elif target == "server":
        victim = victim or (descendants(run.proc.pid, is_server) or [None])[-1]
        if victim is None:
            return None
        if not signal_group(victim.pid, signal.SIGKILL):
            return None
        run.servers_killed += 1
    else:
        w = _trainer(run)
        if w is None:
            return None  # between trainer lives: try again at the next kill
        w.kill()
    return KillRecord(target, kill.phase, step, caught, None, note)


def run_with_kills(run: Run, kills: list[Kill], seed: int, steps: int, timeout: float) -> dict[str, Any]:
    """Launch, deliver ``kills`` in order, relaunch whenever the launcher exits before the run
    is done; check the checkpoint after every kill."""
    rng = random.Random(seed + 1)
    records: list[KillRecord] = []
    ckpt_steps: list[int] = []
    problems: list[str] = []
    t0 = time.monotonic()
    run.launch()
    pending = list(kills)
    while True:
        if time.monotonic() - t0 > timeout:
            problems.append(f"run not finished after {timeout:.0f} s")
            break
        if pending and run.alive():
            rec = strike(run, pending[0], rng, steps, max(5.0, timeout - (time.monotonic() - t0)))
            if rec is not None:
                pending.pop(0)
                time.sleep(0.5)  # the kill lands; a checkpoint being written stays cut
                d, s = _latest_ckpt(run.recover)
                rec.ckpt_step = s
                if d is not None and not (Path(d) / "weights" / "engine_state.pt").is_file():
                    problems.append(f"newest checkpoint {d.name} has no weights")
                if ckpt_steps and (s or 0) < ckpt_steps[-1]:
                    problems.append(f"newest checkpoint went back from {ckpt_steps[-1]} to {s}")
                ckpt_steps.append(s or 0)
                records.append(rec)
                continue
        if run.alive():
            time.sleep(0.1)
            continue
        code = run.proc.returncode
        if code == 0 and last_step(run.fileroot, run.trial) >= steps:
            break
        if run.launches > len(kills) + 3:
            problems.append(f"launcher exited {code} too often:\n{log_tail(run.log, 40)}")
            break
        _, s = _latest_ckpt(run.recover)
        if s is None:
            problems.append(f"launcher exited {code} with no checkpoint:\n{log_tail(run.log, 40)}")
            break
        run.launch()  # recover.mode=auto is in the overrides
    run.stop()
    return {"kills": [asdict(r) for r in records], "not_delivered": len(pending),
            "launches": run.launches, "wall_s": round(time.monotonic() - t0, 1),
            "problems": problems}


def expected_order(data: Path, epochs: int) -> list[list[int]]:
    """Row ids per step as the loader hands them out (seed as in the config), ``epochs`` long."""
    from arealite.api.config.dataset import DatasetConfig
    from arealite.dataset.loader import create_dataloader, load_rows

    rows = load_rows(DatasetConfig(path=str(data / "train.jsonl")))
    dl = create_dataloader(rows, DatasetConfig(path="x.jsonl", batch_size=BATCH, shuffle=True), SEED)
    out = []
    for e in range(epochs):
        dl.sampler.set_epoch(e)
        out += [[r["id"] for r in b] for b in dl]
    return out


def check_run(rdir: Path, mode: str, steps: int, eta: int, n_rows: int,
              order: list[list[int]] | None) -> dict[str, Any]:
    """The exactly-once properties over one finished run; returns figures and violations."""
    from arealite.observe.sample_log import END_FILE_NAME, FILE_NAME, read_ledger

    bad: list[str] = []
    ledger = read_ledger(rdir / "logs" / FILE_NAME)
    if sorted(ledger) != list(range(1, steps + 1)):
        bad.append(f"ledger steps {sorted(ledger)[:5]}..., expected 1..{steps}")
    trained: Counter = Counter()  # (epoch, row) -> episodes trained
    episodes: dict[int, int] = {}  # episode -> step
    drops: Counter = Counter()
    dropped_rows: Counter = Counter()
    for s, line in sorted(ledger.items()):
        if line.get("version") != s:
            bad.append(f"step {s}: version {line.get('version')}")
        st = line.get("staleness_max")
        if st is not None and st > (eta if mode == "async" else 0):
            bad.append(f"step {s}: staleness {st} > {eta}")
        by_ep: dict[int, list[tuple[int, int]]] = {}
        for sid, ep, epoch in zip(line["ids"], line["episodes"], line["epochs"], strict=True):
            by_ep.setdefault(ep, []).append((sid, epoch))
        for ep, seqs in by_ep.items():
            if ep in episodes:
                bad.append(f"episode {ep} trained at steps {episodes[ep]} and {s}")
            episodes[ep] = s
            if len(set(seqs)) != 1 or len(seqs) != N_SAMPLES:
                bad.append(f"step {s}: episode {ep} holds {seqs}")
            trained[seqs[0][1], seqs[0][0]] += 1
        step_drops = line.get("drops", [])
        for d in step_drops:
            drops[d["reason"]] += 1
            dropped_rows[d["epoch"], d["id"]] += 1
        # a synchronous step goes on without a row given up on; an async one draws another
        if len(by_ep) != BATCH and not (mode == "sync" and len(by_ep) + len(step_drops) == BATCH):
            bad.append(f"step {s}: {len(by_ep)} episodes, expected {BATCH}")
        if mode == "sync" and order is not None:
            want = sorted(order[s - 1])
            got = sorted([seqs[0][0] for seqs in by_ep.values()] + [d["id"] for d in step_drops])
            if got != want:
                bad.append(f"step {s}: rows {got}, the uninterrupted order has {want}")
            if by_ep and set(line["epochs"]) != {(s - 1) * BATCH // n_rows}:
                bad.append(f"step {s}: epochs {set(line['epochs'])}")
    twice = [k for k, n in trained.items() if n > 1]
    if twice:
        bad.append(f"rows trained twice in one epoch: {twice[:10]}")
    end = rdir / "logs" / END_FILE_NAME
    inflight = Counter((e, i) for i, e in json.loads(end.read_text())) if end.is_file() else Counter()
    if not end.is_file():
        bad.append("no end-of-run ledger (sample_ids_end.json)")
    accounted = trained + dropped_rows + inflight
    both = [k for k in accounted if accounted[k] > 1]
    if both:
        bad.append(f"rows counted twice (trained/dropped/in flight): {both[:10]}")
    epochs = sorted({e for e, _ in accounted})
    last_open = {e for e, _ in inflight} | ({epochs[-1]} if epochs else set())
    lost = 0
    for e in epochs:
        got = {i for (ee, i) in accounted if ee == e}
        if e not in last_open and got != set(range(n_rows)):
            lost += n_rows - len(got)
            bad.append(f"epoch {e}: rows {sorted(set(range(n_rows)) - got)} never trained or dropped")
    rows = [r for r in metrics(rdir.parent.parent, rdir.name) if r["step"] >= 1]
    for k in ("episodes", "stale", "redrawn", "dropped"):
        vals = [r.get(f"rollout/{k}", 0.0) for r in rows]
        if any(b < a for a, b in zip(vals, vals[1:])):
            bad.append(f"rollout/{k} went back: {vals}")
    final_dropped = rows[-1].get("rollout/dropped", 0.0) if rows else 0.0
    if final_dropped != sum(drops.values()):
        bad.append(f"rollout/dropped = {final_dropped}, the ledger holds {sum(drops.values())} drops")
    return {"steps": len(ledger), "episodes_trained": len(episodes), "rows_trained": sum(trained.values()),
            "trained_twice": len(twice) + len(both), "lost": lost, "drops": dict(drops),
            "in_flight_at_end": sum(inflight.values()), "epochs_seen": len(epochs), "violations": bad}


def one_run(root: Path, model: Path, data: Path, mode: str, kills: list[Kill], seed: int, steps: int,
            eta: int, timeout: float, name: str) -> dict[str, Any]:
    over = [*small_run(model, data, steps, epochs=steps * BATCH // N_ROWS + 1), "launcher.n_servers=2",
            "launcher.max_server_failures=1", "rollout.max_concurrent_rollouts=8",
            "recover.mode=auto", "recover.freq_steps=1", f"recover.retries={len(kills) + 2}",
            "weight_update.type=distributed", "weight_update.bucket_size_mb=0.05",
            "weight_update.timeout=60", "rollout.weight_update_timeout=60",
            "rollout.episode_retries=3"]
    if mode == "async":
        over.append(f"rollout.max_head_offpolicyness={eta}")
    run = Run(CONFIGS[mode], root / name, name, over, root)
    res = run_with_kills(run, kills, seed, steps, timeout)
    rdir = run_dir(run.fileroot, run.trial)
    order = expected_order(data, steps * BATCH // N_ROWS + 1) if mode == "sync" else None
    res["check"] = check_run(rdir, mode, steps, eta, N_ROWS, order)
    res.update(mode=mode, seed=seed, steps=steps, eta=eta if mode == "async" else 0,
               launch_logs=run.logs)
    return res


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    kills = [k for r in results for k in r["kills"]]
    return {
        "runs": len(results),
        "kills": len(kills),
        "kills_by_target": dict(Counter(k["target"] for k in kills)),
        "kills_by_phase": dict(Counter(k["phase"] for k in kills)),
        "phase_caught": sum(k["caught"] for k in kills),
        "rows_lost": sum(r["check"]["lost"] for r in results),
        "trained_twice": sum(r["check"]["trained_twice"] for r in results),
        "checkpoint_problems": sum(len(r["problems"]) for r in results),
        "violations": sum(len(r["check"]["violations"]) for r in results),
        "drops": dict(sum((Counter(r["check"]["drops"]) for r in results), Counter())),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one async run, 3 kills (one per target)")
    p.add_argument("--seed", type=int, default=None, help="the kills' seed (default: drawn, printed)")
    p.add_argument("--kills", type=int, default=56, help="kills over all runs (full form)")
    p.add_argument("--per-run", type=int, default=7, help="kills per run (full form)")
    p.add_argument("--modes", default="async,sync")
    p.add_argument("--eta", type=int, default=1)
    p.add_argument("--root", default=None, help="work folder (default: a new temporary one)")
    p.add_argument("--json", default=None, help="results file (default: benchmarks/results/...)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    a = p.parse_args(argv)
    from arealite.demo.tiny import build_tiny_model
    from arealite.demo.toy_math import write_toy_math

    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"exactly-once: kill seed {seed} (replay with --seed {seed})", flush=True)
    root = Path(a.root) if a.root else Path(tempfile.mkdtemp(prefix="exactly_once_"))
    model = build_tiny_model(root / "model")
    write_toy_math(root / "data", n_train=N_ROWS, n_valid=4, seed=0)
    modes = a.modes.split(",")
    plans: list[tuple[str, list[Kill], int, int]] = []  # mode, kills, run seed, steps
    if a.quick:
        plans.append(("async", plan_kills(seed, 3, first=TARGETS), seed, 14))
    else:
        n_runs = max(1, -(-a.kills // a.per_run))
        for i in range(n_runs):
            rs = seed + i
            plans.append((modes[i % len(modes)], plan_kills(rs, a.per_run), rs, 8 + 4 * a.per_run))
    results = []
    for i, (mode, kills, rs, steps) in enumerate(plans):
        print(f"run {i}: {mode}, {steps} steps, seed {rs}: "
              + ", ".join(f"{k.target}@{k.phase}+{k.gap}" for k in kills), flush=True)
        r = one_run(root, model, root / "data", mode, kills, rs, steps, a.eta, a.timeout, f"run{i}")
        c = r["check"]
        print(f"  {len(r['kills'])} kills, {r['launches']} launches, {r['wall_s']} s: "
              f"{c['rows_trained']} rows trained, lost {c['lost']}, twice {c['trained_twice']}, "
              f"drops {c['drops']}, in flight at end {c['in_flight_at_end']}", flush=True)
        for v in [*r["problems"], *c["violations"]]:
            print("  VIOLATION:", v[:400], flush=True)
        results.append(r)
    s = summarize(results)
    print(f"\n{s['runs']} runs, kills by target {s['kills_by_target']}, by phase "
          f"{s['kills_by_phase']} ({s['phase_caught']} caught in the aimed phase)")
    print(f"kills delivered: {s['kills']} (target >= {3 if a.quick else 50})")
    print(f"rows lost: {s['rows_lost']} (target <= 0)")
    print(f"rows or episodes trained twice: {s['trained_twice']} (target <= 0)")
    print(f"checkpoint problems: {s['checkpoint_problems']} (target <= 0)")
    print(f"ledger violations: {s['violations']} (target <= 0)")
    print(f"rows dropped after retries, by reason: {s['drops'] or 'none'}")
    out = Path(a.json) if a.json else results_dir("exactly_once") / (
        "exactly_once_quick.json" if a.quick else "exactly_once.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seed": seed, "summary": s, "runs": results}, indent=1))
    ok = s["rows_lost"] == 0 and s["trained_twice"] == 0 and s["checkpoint_problems"] == 0 \
        and s["violations"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

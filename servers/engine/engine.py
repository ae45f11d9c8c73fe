"""The continuous-batching engine: one thread that owns the model and steps all sequences.

Every step decodes one token for each running sequence in a single batched forward, and
prefills newly admitted sequences in a second forward, so a request that arrives while others
decode joins at the next step instead of waiting for the batch to drain. Rows of the slot KV
cache stay compact (a finished row is refilled by the last one), so each forward works on a
contiguous view with no copies.

Other threads never touch the model: they enqueue commands (add, abort, pause, continue, or any
callable such as a weight update), which run between steps. The HTTP event loop therefore stays
responsive whatever the engine is doing.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from servers.engine.latency_histogram import E2E_BUCKETS, TTFT_BUCKETS, LatencyHistogram
from servers.engine.model_runner import ModelRunner
from servers.engine.next_token import NextToken
from servers.engine.sequence import Sequence, weight_version_spans
from servers.engine.shared_prefill import prefill_distinct

logger = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "retract", "in_place")
NOT_GENERATION = ("this server serves a reward model (--is-embedding, or a sequence-classification "
                  "checkpoint): it scores on /classify and /encode and does not generate")


def _vision_rows(seqs: list[Sequence]) -> list | None:
    """Each row's VisionPrompt for the runner, or None when no row has images."""
    rows = [s.vision for s in seqs]
    return rows if any(v is not None for v in rows) else None


def _internal_error(message: str) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": 500,
            "err_type": "InternalServerError"}


class Engine:
    def __init__(
        self,
        runner: ModelRunner,
        weight_version: str = "default",
        max_running_requests: int = 256,
        max_prefill_tokens: int = 16384,
        random_seed: int | None = None,
        max_loras_per_batch: int = 8,
    ) -> None:
        self.runner = runner
        self.max_loras_per_batch = max_loras_per_batch
        self.weight_version = weight_version
        self.max_running = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.paused_mode: str | None = None
        # memory tags given back by /release_memory_occupation: no step runs until resumed
        self.memory_released: set[str] = set()
        self.spilled_weights: str | None = None  # CPU: file holding released weights
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.stats: dict[str, float] = {
            "prompt_tokens_total": 0, "generation_tokens_total": 0, "num_requests_total": 0,
            "num_aborted_requests_total": 0, "e2e_latency_sum": 0.0, "e2e_latency_count": 0,
            "forward_passes_total": 0, "weight_updates_total": 0, "weight_load_seconds_sum": 0.0,
        }
        self._recent: deque[tuple[float, int]] = deque(maxlen=256)  # (time, tokens) per step
        self.ttft_hist = LatencyHistogram(TTFT_BUCKETS)  # /metrics; one observe per request
        self.e2e_hist = LatencyHistogram(E2E_BUCKETS)
        # each row's next token: sampling settings, logit adjustments, grammar, stop rules
        self.next_token = NextToken(runner, random_seed)
        self.last_step_time = time.time()
        self.heartbeat = time.monotonic()  # each turn of the loop: a stuck step stops it

    # ---- lifecycle and thread-safe API -------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop

    def stalled_for(self) -> float:
        """Seconds since the loop last came round (an idle loop comes round every 0.5 s)."""
        return time.monotonic() - self.heartbeat

    def shutdown(self) -> None:
        self._stop = True
        self._cmds.put(lambda: None)
        self._thread.join(timeout=10)

    def call(self, fn: Callable[[], Any]) -> cf.Future:
        """Run ``fn()`` in the engine thread between steps; returns a future of its result."""
        fut: cf.Future = cf.Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn())
            except BaseException as e:  # delivered to the caller, engine keeps going
                fut.set_exception(e)

        self._cmds.put(run)
        return fut

    def submit(self, seq: Sequence) -> None:
        self._cmds.put(lambda: self._add(seq))

    def abort(self, rid: str = "", abort_all: bool = False) -> cf.Future:
        return self.call(lambda: self._abort(rid, abort_all))

    def pause(self, mode: str) -> cf.Future:
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")
        return self.call(lambda: self._pause(mode))

    def resume(self) -> cf.Future:
        return self.call(self._resume)

    def load(self) -> dict[str, int]:
        return {"num_running_reqs": len(self.running), "num_queue_reqs": len(self.waiting)}

    def num_tokens(self) -> int:
        """Tokens this server holds or will prefill: KV of running rows plus the waiting
        sequences' prompt + output (SGLang's ``num_tokens`` load: used KV + pending prefill).
        Read from the HTTP thread: snapshots of the lists, a momentary figure."""
        return (sum(s.kv_len for s in list(self.running))
                + sum(s.total_len() for s in list(self.waiting)))

    def gen_throughput(self) -> float:
        recent = list(self._recent)
        if len(recent) < 2:
            return 0.0
        span = recent[-1][0] - recent[0][0]
        return sum(n for _, n in recent[1:]) / span if span > 0 else 0.0

    # ---- engine-thread commands ----------------------------------------------------------
    def _add(self, seq: Sequence) -> None:
        if not self.runner.is_generation:  # a reward model: /classify, never a generation
            self._finish(seq, {"type": "abort", "message": NOT_GENERATION, "status_code": 400,
                               "err_type": "BadRequest"})
            return
        budget = self.runner.context_len - len(seq.prompt) - 1
        mnt = seq.params.max_new_tokens
        seq.max_new_tokens = budget if mnt is None else max(0, min(mnt, budget))
        if not seq.internal:
            self.stats["num_requests_total"] += 1
            self.stats["prompt_tokens_total"] += len(seq.prompt)
        self.waiting.append(seq)

    def set_weight_version(self, new_version: str | None) -> None:
        """Switch the served version; live sequences record where the change fell."""
        if new_version is None or new_version == self.weight_version:
            return
        old = self.weight_version
        for seq in [*self.running, *self.waiting]:
            if seq.output_ids:
                seq.version_events.append((old, len(seq.output_ids)))
        self.weight_version = new_version

    def _abort(self, rid: str, abort_all: bool) -> int:
        if not abort_all and not rid:
            return 0  # SGLang ignores an empty rid without abort_all
        if not abort_all and not any(s.rid == rid for s in (*self.running, *self.waiting)):
            return 0  # SGLang forwards an abort only when a live request has exactly this rid
        hit = lambda s: abort_all or s.rid.startswith(rid)  # noqa: E731
        n = 0
        for seq in [s for s in self.waiting if hit(s)]:
            self.waiting.remove(seq)
            msg = "Aborted" if seq.ever_ran else "Abort in waiting queue"
            self._finish(seq, {"type": "abort", "message": msg, "status_code": None, "err_type": None})
            n += 1
        doomed = [s for s in self.running if hit(s)]
        for seq in doomed:
            self._finish(seq, {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None})
        self._remove_rows(doomed)
        self.stats["num_aborted_requests_total"] += n + len(doomed)
        return n + len(doomed)

    def _pause(self, mode: str) -> None:
        if mode == "abort":
            self._abort("", abort_all=True)
        elif mode == "retract":
            # Back to the head of the queue in order; re-prefilled (prompt + output) later.
            for seq in reversed(self.running):
                seq.kv_len, seq.row = 0, -1
                seq.num_retractions += 1
                self.waiting.appendleft(seq)
            self.running = []
            self.runner.cache.release()
        self.paused_mode = mode

    def _resume(self) -> None:
        self.paused_mode = None

    def flush_cache(self) -> bool:
        """SGLang flushes only when fully idle (queued requests ignored while paused)."""
        if self.running or (self.waiting and self.paused_mode is None):
            return False
        self.runner.cache.release()
        return True

    # ---- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        # Commands (aborts moving KV rows, weight loads) run here too: one inference-mode scope.
        with torch.inference_mode():
            self._run()

    def _run(self) -> None:
        while not self._stop:
            self.heartbeat = time.monotonic()
            self._drain(block=not self._runnable())
            if self._stop or not self._runnable():
                continue
            try:
                self._step()
            except Exception:  # never leave clients hanging, never fail the innocent
                logger.exception("engine step failed; finding the request(s) that caused it")
                self._isolate_fault()

    def _runnable(self) -> bool:
        return (self.paused_mode is None and not self.memory_released
                and bool(self.running or self.waiting))

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._cmds.get(timeout=0.5) if block else self._cmds.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                cmd()
            except Exception:
                logger.exception("engine command failed")
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return

    def _isolate_fault(self) -> None:
        """After a failed step, run each of its rows alone: the ones that fail alone get a
        500, the others go back to the head of the queue and carry on.

        A failed step may have written KV entries without appending their tokens, so every row
        first drops its KV and is later prefilled again from prompt + output (as a retraction
        does). Each solo step also samples that row's next token, so rows whose fault came
        only from sharing a batch (say, memory) still make progress, one step at a time.
        """
        suspects = [q for q in self.running if not q.finished]
        self._drop_rows(suspects)
        queued, survivors = self.waiting, []
        for q in suspects:
            self.waiting = deque([q])
            try:
                self._step()
            except Exception as e:
                logger.exception("request %s fails alone; answering it with a 500", q.rid)
                self._finish(q, _internal_error(f"Internal engine error: {e}"))
            self._drop_rows([r for r in self.running if not r.finished])
            if not q.finished:
                survivors.append(q)
        self.waiting = deque(survivors) + queued

    def _drop_rows(self, seqs: list[Sequence]) -> None:
        for q in seqs:
            q.kv_len, q.row = 0, -1
        self.running = []
        self.runner.cache.release()

    def _admit(self) -> list[Sequence]:
        new: list[Sequence] = []
        longest = 0
        loras = {s.lora for s in self.running if s.lora is not None}
        while self.waiting and len(self.running) + len(new) < self.max_running:
            n = len(self.waiting[0].prompt) + len(self.waiting[0].output_ids)
            if new and max(longest, n) * (len(new) + 1) > self.max_prefill_tokens:
                break
            lora = self.waiting[0].lora
            if lora is not None and lora not in loras:
                if len(loras) >= self.max_loras_per_batch:
                    break  # --max-loras-per-batch: waits for a running adapter to finish
                loras.add(lora)
            longest = max(longest, n)
            seq = self.waiting.popleft()
            seq.ever_ran = True
            new.append(seq)
        return new

    def _step(self) -> None:
        runner = self.runner
        old = self.running
        new = self._admit()
        self.running = old + new  # before any forward: a fault must still answer the new ones
        hidden: list[torch.Tensor] = []
        if old:
            tokens = torch.tensor([[s.output_ids[-1]] for s in old], device=runner.device)
            starts = torch.tensor([s.kv_len for s in old], device=runner.device)
            hidden.append(runner.forward(0, tokens, starts, _vision_rows(old),
                                         [s.lora for s in old])[:, 0])
            routed = runner.routed.take(len(old), 1) if runner.routed is not None else None
            for i, s in enumerate(old):
                if s.routing is not None:
                    s.routing.write(s.kv_len, routed[i])
                s.kv_len += 1
        if new:
            hidden.append(self._prefill(len(old), new))
        for i, s in enumerate(self.running):
            s.row = i
        self.stats["forward_passes_total"] += len(hidden)
        logits = runner.logits(torch.cat(hidden) if len(hidden) > 1 else hidden[0])
        active = self.running
        # max_new_tokens == 0: prefill only, nothing sampled.
        done = [s for s in new if s.max_new_tokens == 0]
        for s in done:
            self._finish(s, {"type": "length", "length": 0})
        tokens, logps, tops = self.next_token.sample(active, logits)
        for s in self.next_token.grammar.sampled(active, tokens):
            self._finish(s, _internal_error("the grammar rejected a sampled token"))
            done.append(s)
        now = time.time()
        produced = 0
        for i, s in enumerate(active):
            if s.finished:
                continue
            tok = tokens[i]
            s.output_ids.append(tok)
            s.output_logprobs.append(logps[i])
            if s.top_logprobs_num > 0:
                s.output_top.append(tops[i])
            if s.first_token_time is None:
                s.first_token_time = now
            produced += 1
            reason = self.next_token.stop_reason(s, tok)
            if reason is not None:
                self._finish(s, reason)
                done.append(s)
            elif s.stream and s.on_event is not None:
                interval = s.params.stream_interval or 1
                if len(s.output_ids) % interval == 0:
                    s.on_event(s, len(s.output_ids), False)
        self.stats["generation_tokens_total"] += produced
        self._recent.append((now, produced))
        self.last_step_time = now
        self._remove_rows(done)

    def _prefill(self, r0: int, new: list[Sequence]) -> torch.Tensor:
        """One padded forward over the new rows' distinct feeds (``shared_prefill``); returns
        the hidden state of each row's last token."""
        runner = self.runner
        feeds = [s.feed_tokens() for s in new]
        hid, pick = prefill_distinct(runner, r0, new, feeds)
        routed = runner.routed.take(*hid.shape[:2]) if runner.routed is not None else None
        for b, s in enumerate(new):
            if s.routing is not None:  # a prefill feeds from position 0 (kv_len is 0)
                s.routing.write(s.kv_len, routed[pick[b], : len(feeds[b])])
            s.kv_len = len(feeds[b])
            if s.return_logprob and s.input_logprobs is None and not s.output_ids:
                self._input_logprobs(s, hid[pick[b]])
        last = torch.tensor([len(f) - 1 for f in feeds], device=runner.device)
        return hid[torch.tensor(pick, device=runner.device), last]

    def _input_logprobs(self, s: Sequence, hid: torch.Tensor) -> None:
        n = len(s.prompt)
        start = n if s.logprob_start_len < 0 else s.logprob_start_len
        s.input_logprobs, s.input_top = [], []
        if start >= n:
            return
        lp = torch.log_softmax(self.runner.logits(hid[start : n - 1]) / s.params.temperature, -1)
        lp.clamp_(min=torch.finfo(lp.dtype).min)
        targets = torch.tensor(s.prompt[start + 1 : n], device=lp.device)
        vals = lp.gather(1, targets.view(-1, 1)).view(-1).tolist() if n - 1 > start else []
        s.input_logprobs = [None, *vals]
        if s.top_logprobs_num > 0:
            k = min(s.top_logprobs_num, lp.shape[-1])
            tv, ti = lp.topk(k, dim=-1)
            s.input_top = [None] + [list(zip(v, i)) for v, i in zip(tv.tolist(), ti.tolist())]

    def _finish(self, s: Sequence, reason: dict[str, Any]) -> None:
        s.finish = reason
        s.finished_time = time.time()
        s.spans = weight_version_spans(s.version_events, self.weight_version, len(s.output_ids))
        if not s.internal:
            self.stats["e2e_latency_sum"] += s.finished_time - s.created
            self.stats["e2e_latency_count"] += 1
            self.e2e_hist.observe(s.finished_time - s.created)
            if s.first_token_time is not None:
                self.ttft_hist.observe(s.first_token_time - s.created)
        if s.on_event is not None:
            s.on_event(s, len(s.output_ids), True)

    def _remove_rows(self, seqs: list[Sequence]) -> None:
        """Drop finished rows, refilling each hole with the last row to keep rows compact."""
        rows = sorted({s.row for s in seqs if 0 <= s.row < len(self.running)
                       and self.running[s.row] is s}, reverse=True)
        for r in rows:
            last = len(self.running) - 1
            if r != last:
                mover = self.running[last]
                self.runner.cache.move_row(last, r, mover.kv_len)
                self.running[r] = mover
                mover.row = r
            self.running.pop()
        for s in seqs:
            s.row = -1
        if not self.running and not self.waiting:
            self.runner.cache.release()

"""What the Tinker service does, apart from HTTP (``arealite.tinker.app``): sessions, training
models, their versions on the servers, sampling sessions, and the work behind each future.

Training work runs on one trainer thread, in arrival order (the SDK sends a training client's
calls in ``seq_id`` order and waits for each to be accepted), so the gradient of a
``forward_backward`` is always the one its ``optim_step`` applies. The methods that train are
plain functions that queue their trainer job when called (in the HTTP handler, before its
answer goes out) and return an awaitable of the outcome: the order is fixed at arrival, and the
trainer starts while the answer is still being written. Sampling runs on the event
loop, against the server pool, at the same time as training.

Every call that changes what a sampling client would see is versioned: ``save_weights_for_sampler``
pushes the model as its next version ``k`` and the sampling session records ``k`` (and, for
LoRA, the adapter that holds it); ``arealite.tinker.sampler`` then sends only requests for
``k``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arealite.api.config.actor import LoRAConfig, OptimizerConfig
from arealite.tinker.config import TinkerServerConfig
from arealite.tinker.futures import Futures, Outcome, UserError
from arealite.tinker.losses import LossInputError
from arealite.tinker.pusher import WeightPusher
from arealite.tinker.sampler import PoolSampler, SamplingSession
from arealite.tinker.trainer import AdamStep, TinkerModel
from arealite.tinker.wire import (
    FwdBwdRequest,
    encode_forward_backward_output,
    encode_sample_response,
)
from arealite.utils.keys import ClientKeys

logger = logging.getLogger("arealite.tinker.service")

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


@dataclass
class ModelEntry:
    model_id: str
    session_id: str
    model: TinkerModel
    pusher: WeightPusher
    lora_rank: int | None
    version: int = 0  # of the last push (0: none yet, the servers hold the base model)
    reserved: int = 0  # the last version handed to a queued push (>= version)
    # sampler checkpoints by name: (version, adapter)
    sampler_names: dict[str, tuple[int, str | None]] = field(default_factory=dict)


class TinkerService:
    def __init__(self, config: TinkerServerConfig) -> None:
        self.config = config
        self.root = config.root()
        self.futures = Futures()
        self.sessions: set[str] = set()
        self.models: dict[str, ModelEntry] = {}
        self.samplers: dict[str, SamplingSession] = {}
        self._clones = itertools.count(1)
        self._creating: dict[str, bool] = {}  # model id -> full-weight, while being built
        self.trainer = ThreadPoolExecutor(1, thread_name_prefix="tinker-trainer")
        keys = ClientKeys.from_config(config.rollout.api_key, config.rollout.admin_api_key)
        self.sampler = PoolSampler(list(config.rollout.server_addrs), keys.api_headers,
                                   config.rollout.request_timeout)

    # ------------------------------------------------------------------ helpers

    def on_trainer(self, fn, *args) -> asyncio.Future:
        """``fn(*args)`` queued on the trainer thread now; await the future for its result."""
        return asyncio.get_running_loop().run_in_executor(self.trainer, fn, *args)

    def entry(self, model_id: str) -> ModelEntry:
        e = self.models.get(model_id)
        if e is None:
            raise UserError(f"unknown model_id {model_id!r}")
        return e

    def check_base_model(self, name: str) -> None:
        if name != self.config.model_name():
            raise UserError(f"base_model {name!r} is not served here; this server has "
                            f"{self.config.model_name()!r}")

    def capabilities(self) -> dict[str, Any]:
        return {"supported_models": [{
            "model_name": self.config.model_name(), "trainable": True, "sampleable": True,
            "max_context_length": self.config.max_context_length}]}

    def new_session(self) -> str:
        sid = f"s-{uuid.uuid4().hex[:12]}"
        self.sessions.add(sid)
        return sid

    # ------------------------------------------------------------------ training models

    def _build_model(self, model_id: str, session_id: str, lora: dict[str, Any] | None
                     ) -> ModelEntry:
        cfg = self.config
        lcfg = None
        if lora is not None:
            targets = [*(ATTN if lora.get("train_attn", True) else ()),
                       *(MLP if lora.get("train_mlp", True) else ())]
            if not targets:
                raise UserError("lora_config trains neither attention nor MLP layers")
            rank = int(lora["rank"])
            lcfg = LoRAConfig(rank=rank, alpha=cfg.lora_alpha or 2.0 * rank,
                              target_modules=targets)
        engine_cfg = cfg.model.model_copy(update={
            "lora": lcfg, "optimizer": cfg.model.optimizer or OptimizerConfig()})
        mdir = self.root / "models" / model_id
        pusher = WeightPusher(cfg.rollout, cfg.weight_update, lcfg is not None, mdir / "weights",
                              cfg.keep_versions)
        seed = int(lora.get("seed") or cfg.seed) if lora else cfg.seed
        model = TinkerModel(engine_cfg, cfg.device, cfg.dist_backend, seed, pusher.clock)
        return ModelEntry(model_id, session_id, model, pusher, lcfg.rank if lcfg else None)

    async def create_model(self, session_id: str, base_model: str,
                           lora: dict[str, Any] | None) -> Outcome:
        self.check_base_model(base_model)
        if session_id not in self.sessions:
            raise UserError(f"unknown session_id {session_id!r}")
        model_id = f"m-{uuid.uuid4().hex[:12]}"
        self._check_servers_shared(lora is None)
        self._creating[model_id] = lora is None  # counted by the check until built
        try:
            entry = await self.on_trainer(self._build_model, model_id, session_id, lora)
        except (ValueError, TypeError) as e:
            raise UserError(str(e)) from None
        finally:
            del self._creating[model_id]
        self.models[model_id] = entry
        logger.info("model %s: %s", model_id,
                    f"LoRA rank {entry.lora_rank}" if entry.lora_rank else "every weight")
        return Outcome(json={"model_id": model_id, "type": "create_model"})

    def _check_servers_shared(self, full: bool) -> None:
        """A full-weight model's pushes replace the weights the servers hold, under every LoRA
        adapter and every base-model sampling client: it trains alone on its service."""
        fulls = [m for m, e in self.models.items() if e.lora_rank is None]
        fulls += [m for m, f in self._creating.items() if f]
        others = len(self.models) + len(self._creating) - len(fulls)
        if fulls:
            raise UserError(f"full-weight model {fulls[0]} trains on this service's servers; "
                            "it must be the only training client here (start another service "
                            "over other servers)")
        if full and others:
            raise UserError(f"a full-weight training client replaces the servers' weights, and "
                            f"{others} LoRA training client(s) use them; create it on a service "
                            "of its own")

    def info(self, model_id: str) -> dict[str, Any]:
        e = self.entry(model_id)
        name = self.config.model_name()
        return {"type": "get_info", "model_id": model_id, "model_name": name,
                "is_lora": e.lora_rank is not None, "lora_rank": e.lora_rank,
                "model_data": {"arch": "causal_lm", "model_name": name, "tokenizer_id": name}}

    def forward_backward(self, req: FwdBwdRequest) -> Awaitable[Outcome]:
        e = self.entry(req.model_id)
        job = self.on_trainer(e.model.forward_backward, req.data, req.loss_fn,
                              req.loss_fn_config, req.forward_only)

        async def done() -> Outcome:
            try:
                outs, metrics = await job
            except LossInputError as err:
                raise UserError(str(err)) from None
            return Outcome(proto=encode_forward_backward_output(outs, metrics))
        return done()

    def optim_step(self, model_id: str, params: dict[str, Any]) -> Awaitable[Outcome]:
        e = self.entry(model_id)
        known = set(AdamStep.__dataclass_fields__)
        unknown = set(params) - known - {"type"}
        if unknown or params.get("type", "adam") not in ("adam", "adamw"):
            raise UserError(f"only AdamParams are supported (got {sorted(unknown) or params})")
        step = AdamStep(**{k: float(v) for k, v in params.items() if k in known})
        return _json_of(self.on_trainer(e.model.optim_step, step), lambda m: {"metrics": m})

    # ------------------------------------------------------------------ checkpoints

    def _path(self, model_id: str, kind: str, name: str) -> str:
        return f"tinker://{model_id}/{kind}/{name}"

    def _parse(self, path: str, kind: str) -> tuple[ModelEntry, str]:
        m = re.fullmatch(r"tinker://([^/]+)/([a-z_]+)/([^/]+)", path or "")
        if m is None or m.group(2) != kind:
            raise UserError(f"not a {kind} path of this server: {path!r} "
                            f"(expected tinker://<model_id>/{kind}/<name>)")
        return self.entry(m.group(1)), m.group(3)

    def _state_dir(self, model_id: str, name: str) -> Path:
        return self.root / "models" / model_id / "state" / name

    def save_state(self, model_id: str, name: str | None) -> Awaitable[Outcome]:
        e = self.entry(model_id)
        if name is not None and not _NAME.match(name):
            raise UserError(f"checkpoint name {name!r}: letters, digits, '.', '_', '-' only")
        job = self.on_trainer(self._save_state, e, name)
        return _json_of(job, lambda name: {"path": self._path(model_id, "weights", name),
                                           "type": "save_weights"})

    def _save_state(self, e: ModelEntry, name: str | None) -> str:
        """On the trainer thread: the default name counts the steps taken before this call."""
        name = name or f"step{e.model.steps:06d}"
        e.model.save_state(str(self._state_dir(e.model_id, name)), True)
        return name

    def load_state(self, model_id: str, path: str, optimizer: bool) -> Awaitable[Outcome]:
        e = self.entry(model_id)
        src, name = self._parse(path, "weights")
        if (src.lora_rank is None) != (e.lora_rank is None) or src.lora_rank != e.lora_rank:
            raise UserError(f"{path!r} was saved by a model with LoRA rank {src.lora_rank}; "
                            f"this one has {e.lora_rank}")
        job = self.on_trainer(self._load_state, e, self._state_dir(src.model_id, name), path,
                              optimizer)
        return _json_of(job, lambda _: {"path": path, "model_id": model_id,
                                        "type": "load_weights"})

    def _load_state(self, e: ModelEntry, folder: Path, path: str, optimizer: bool) -> None:
        """On the trainer thread, so a save queued before this load has been written."""
        if not folder.exists():
            raise UserError(f"no checkpoint at {path!r}")
        e.model.load_state(str(folder), optimizer)

    # ------------------------------------------------------------------ sampling

    def save_for_sampler(self, model_id: str, name: str | None,
                         sampling_session_seq_id: int | None) -> Awaitable[Outcome]:
        e = self.entry(model_id)
        if name is not None and not _NAME.match(name):
            raise UserError(f"checkpoint name {name!r}: letters, digits, '.', '_', '-' only")
        e.reserved += 1  # at arrival: two pushes queued back to back get two versions
        job = self.on_trainer(e.pusher.push, e.model.engine, e.reserved)
        return self._pushed(e, e.reserved, job, name, sampling_session_seq_id)

    async def _pushed(self, e: ModelEntry, version: int, job: Awaitable[str | None],
                      name: str | None, sampling_session_seq_id: int | None) -> Outcome:
        adapter = await job
        e.version = max(e.version, version)
        out: dict[str, Any] = {"type": "save_weights_for_sampler"}
        if name is not None:
            e.sampler_names[name] = (version, adapter)
            out["path"] = self._path(e.model_id, "sampler_weights", name)
        if name is None or sampling_session_seq_id is not None:
            sid = self._new_sampler(e.model_id, version, adapter, None)
            out["sampling_session_id"] = sid
        return Outcome(json=out)

    def _new_sampler(self, model_id: str | None, version: int, adapter: str | None,
                     model_path: str | None) -> str:
        sid = f"sampler-{uuid.uuid4().hex[:12]}"
        self.samplers[sid] = SamplingSession(sid, self.config.model_name(), model_id, version,
                                             adapter, model_path)
        return sid

    def create_sampling_session(self, session_id: str, model_path: str | None,
                                base_model: str | None) -> str:
        if session_id not in self.sessions:
            raise UserError(f"unknown session_id {session_id!r}")
        if model_path:
            e, name = self._parse(model_path, "sampler_weights")
            if name not in e.sampler_names:
                raise UserError(f"no sampler weights at {model_path!r}")
            version, adapter = e.sampler_names[name]
            return self._new_sampler(e.model_id, version, adapter, model_path)
        self.check_base_model(base_model or "")
        return self._new_sampler(None, 0, None, None)

    def sampler_session(self, sid: str) -> SamplingSession:
        s = self.samplers.get(sid or "")
        if s is None:
            raise UserError(f"unknown sampling_session_id {sid!r}")
        return s

    def join(self, sid: str) -> int:
        self.sampler_session(sid)
        return next(self._clones)

    async def sample(self, sess: SamplingSession, prompt: list[int], n: int,
                     params: dict[str, Any], prompt_logprobs: bool) -> Outcome:
        if not prompt:
            raise UserError("empty prompt")
        if n < 1:
            raise UserError("num_samples must be >= 1")
        pushed = [e for e in self.models.values() if e.lora_rank is None and e.version > 0]
        if sess.model_id is None and pushed:
            raise UserError(f"the servers hold full-weight model {pushed[0].model_id}'s version "
                            f"{pushed[0].version}, not the base model: sample from a sampling "
                            "client of that model")
        try:
            seqs, plp = await self.sampler.sample(sess, prompt, n, params, prompt_logprobs)
        except ValueError as e:
            raise UserError(str(e)) from None
        return Outcome(proto=encode_sample_response(seqs, plp))

    # ------------------------------------------------------------------ shutdown

    async def close(self) -> None:
        await self.sampler.close()
        for e in self.models.values():
            e.pusher.destroy()
            e.model.destroy()
        self.trainer.shutdown(wait=False)


async def _json_of(job: Awaitable[Any], answer: Callable[[Any], dict[str, Any]]) -> Outcome:
    """The JSON outcome ``answer(result)`` of a queued trainer job."""
    return Outcome(json=answer(await job))

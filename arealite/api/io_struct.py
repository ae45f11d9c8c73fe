"""Data passed between the layers: requests, responses, weight-update and checkpoint metadata.

The trajectory contract (what a ``RolloutWorkflow`` returns) is ``arealite.api.trajectory``.
"""

from __future__ import annotations

import enum
import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from arealite.api.config.rollout import GenerationHyperparameters

StopReason = Literal["length", "stop", "abort"]

DISK_READY_MARKER = "arealite_weights_ready.json"
_ID_LIST_CHARS = b"0123456789, "  # what the repr of a list of non-negative ints holds


def token_ids_json(ids: Any) -> bytes | None:
    """``ids`` as JSON (UTF-8 bytes) when it is a non-empty list of non-negative ints, else None.

    The repr of such a list is its JSON (``[1, 2, 3]``), and any other item (a negative, a
    bool, a float, None, a string, a nested list, a numpy 2 scalar) shows as a character other
    than a digit, a comma or a space between the brackets: so one ``str`` and one C scan both
    check the ids and encode them, at less than the cost of checking their types alone
    (the client's per-request hot path). An item that prints as a plain number (a numpy 1
    integer) is that number in the JSON too.
    """
    if type(ids) is not list or not ids:
        return None
    text = str(ids).encode()
    return None if text[1:-1].translate(None, _ID_LIST_CHARS) else text


@dataclass(slots=True)
class ModelRequest:
    """One generation request: a prompt as token ids plus sampling settings."""

    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    input_ids: list[int] = field(default_factory=list)
    gconfig: GenerationHyperparameters = field(default_factory=GenerationHyperparameters)
    metadata: dict[str, Any] = field(default_factory=dict)
    # the prompt's images, in the order of its image placeholders: file paths, file:// URLs
    # or base64 (SGLang's ``image_data``); the prompt's ids hold their tokens
    image_data: list[str] | None = None

    def validate(self) -> bytes:
        """Raise ``ValueError`` on a request no server could serve (checked before any HTTP);
        return ``input_ids`` as JSON (bytes), which the engine sends as it is."""
        if not isinstance(self.rid, str) or not self.rid:
            raise ValueError("ModelRequest.rid must be a non-empty string")
        ids = self.input_ids
        text = token_ids_json(ids)
        if text is None:  # not a list of non-negative ints: say what is wrong (or take a tuple)
            if len(ids) == 0:
                raise ValueError(f"ModelRequest {self.rid}: input_ids is empty")
            bad = sorted({type(t).__name__ for t in ids if type(t) is not int})
            if bad:
                raise ValueError(
                    f"ModelRequest {self.rid}: input_ids must be non-negative ints, got "
                    + ", ".join(bad)
                )
            if min(ids) < 0:
                raise ValueError(f"ModelRequest {self.rid}: input_ids must be non-negative ints")
            text = json.dumps(list(ids)).encode()
        if not isinstance(self.gconfig, GenerationHyperparameters):
            raise ValueError(f"ModelRequest {self.rid}: gconfig must be GenerationHyperparameters")
        if self.gconfig.max_new_tokens < 0:
            raise ValueError(f"ModelRequest {self.rid}: max_new_tokens must be >= 0")
        return text

    def copy(self) -> ModelRequest:
        return ModelRequest(
            rid=self.rid,
            input_ids=list(self.input_ids),
            gconfig=self.gconfig.model_copy(),
            metadata=dict(self.metadata),
        )


LLMRequest = ModelRequest


@dataclass(slots=True)
class ModelResponse:
    """The outcome of one request; ``output_versions`` has one version per output token."""

    input_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    stop_reason: StopReason = "stop"
    latency: float = float("inf")
    ttft: float = float("inf")  # time to first token (seconds)
    server: str = ""  # address of the server that produced the last segment
    scores: list[float] | None = None  # a scoring server's head outputs (reward model), else None
    # a mixture-of-experts server's routing (``gconfig.return_routed_experts``): int32
    # ``[input_len + output_len - 1, num_layers * top_k]``, one row per token fed to a forward
    # (every token but the last), as the server routed it; None when not asked
    routed_experts: Any = None

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)


LLMResponse = ModelResponse


# Send buffers of vLLM's packed weight transfer (its default); trainer and servers must agree.
SEND_BUFFERS = 2


class WeightUpdateType(str, enum.Enum):
    DISK = "disk"
    DISTRIBUTED = "distributed"
    TENSOR = "tensor"  # same host: /update_weights_from_tensor by shared-memory / IPC reference


@dataclass
class ParamSpec:
    """Name, shape and dtype (torch attribute name, e.g. ``"bfloat16"``) of one parameter."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n

    @property
    def nbytes(self) -> int:
        import torch

        return self.numel * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


@dataclass
class WeightUpdateMeta:
    """How the trainer hands new weights to the servers.

    ``disk``: the trainer writes an HF directory at ``path`` and the servers load it.
    ``distributed``: the trainer (rank 0) broadcasts over a group it builds exactly as SGLang
    does (``master_address:master_port``, ``group_name``), in buckets of ``bucket_size_mb``.

    ``param_specs`` (distributed): the buckets, in broadcast order; the trainer fills them with
    ``engine.get_param_specs(bucket_size_mb)`` before either side starts. ``world_size``
    (distributed): ranks in the weight-update group, ``1 + Σ tp_size`` over the servers (the
    trainer is rank 0). The client's ``update_weights(meta)`` sets it from ``/server_info`` when
    it is None; the trainer's ``upload_weights(meta)`` waits (up to ``timeout``) until it is set.
    ``backend`` (distributed): ``gloo``/``nccl`` for that group; None lets each side pick from
    its device (nccl on CUDA, gloo otherwise), so set it when trainer and servers differ.
    """

    type: WeightUpdateType | str = WeightUpdateType.DISK
    version: int = 0
    path: str | None = None
    group_name: str = "weight_update_group"
    master_address: str = "127.0.0.1"
    master_port: int | None = None
    bucket_size_mb: float = 64.0
    timeout: float = 600.0
    param_specs: list[list[ParamSpec]] = field(default_factory=list)  # one list per bucket
    world_size: int | None = None  # 1 + Σ tp_size (trainer = rank 0); set by the client
    backend: str | None = None  # weight-update group backend; None: per-device default
    # Who receives a distributed update, set by the client before ``world_size``: "sglang"
    # (SGLang's weight-update group) or "vllm" (vLLM's NCCL weight-transfer engine, sent with
    # vLLM's own trainer-side helpers: arealite.backends.vllm.weight_send).
    receiver: str = "sglang"
    # Verification (docs/weight_updates.md): with ``verify`` the trainer publishes
    # ``checksums`` (name -> (dtype, 16-hex checksum) of what it sent, each tensor cast to
    # ``checksum_dtype`` when set: the dtype the servers hold) and the client compares every
    # server's /weights_checker answer with them.
    verify: bool = False
    checksum_dtype: str | None = None
    checksums: dict[str, tuple[str, str]] | None = None
    # Set by the client when its half of a distributed update failed (a server died before or
    # during the transfer): the trainer's upload stops waiting for peers that will never come
    # and fails at once, instead of waiting out ``timeout`` (push_weights then retries).
    abort_reason: str | None = None
    # Tensor updates (same host, docs/weight_updates.md): the client publishes ``targets``
    # (servers paused and waiting for the push) once they are ready; trainer rank r sends to
    # ``targets[i]`` for every i with i % world_size == r, then rank 0 publishes
    # ``target_failures`` (server -> reason; empty when every push landed), which ends the wait.
    targets: list[str] | None = None
    target_failures: dict[str, str] | None = None
    # LoRA: ``path`` holds only an adapter (peft's format), loaded under this name beside the
    # older versions (``/load_lora_adapter``), with no pause (arealite.weights.adapters).
    lora_name: str | None = None
    # LoRA tensor pushes: (adapter config dict, {peft key: tensor}) that trainer rank 0 sent,
    # kept by the client to load the current adapter on a server it re-admits.
    lora_tensors: tuple[dict[str, Any], dict[str, Any]] | None = None
    # LoRA: pause the servers around the load (pause -> load -> continue), as a full-weight
    # update does, instead of loading beside the running versions.
    lora_pause: bool = False
    # The weight transport moving it (a name of ``arealite.weights.table``), chosen once from
    # the config and the backend; None (an update built by hand): the one ``type`` implies.
    transport: str | None = None

    def __post_init__(self) -> None:
        self.type = WeightUpdateType(self.type)
        if self.type == WeightUpdateType.DISK and not self.path:
            raise ValueError("a disk weight update needs a path")

    @classmethod
    def disk(cls, version: int, root: str | os.PathLike, timeout: float = 600.0) -> WeightUpdateMeta:
        """A disk update to ``version``: the HF files go to ``root/v<version>``."""
        return cls(WeightUpdateType.DISK, version, os.path.join(root, f"v{version}"), timeout=timeout)

    @classmethod
    def broadcast(
        cls, version: int, param_specs: list[list[ParamSpec]], master_port: int,
        master_address: str = "127.0.0.1", group_name: str = "weight_update_group",
        bucket_size_mb: float = 64.0, timeout: float = 600.0,
    ) -> WeightUpdateMeta:
        """A broadcast (``distributed``) update to ``version`` over the group at
        ``master_address:master_port``, in the buckets of ``param_specs``."""
        return cls(
            WeightUpdateType.DISTRIBUTED, version, group_name=group_name,
            master_address=master_address, master_port=master_port,
            bucket_size_mb=bucket_size_mb, timeout=timeout, param_specs=param_specs,
        )

    @property
    def bucket_bytes(self) -> int:
        """``bucket_size_mb`` in bytes (vLLM's transfer: the packed chunk size both sides use)."""
        return int(self.bucket_size_mb * 1024 * 1024)

    @classmethod
    def tensor(cls, version: int, bucket_size_mb: float = 64.0, timeout: float = 600.0
               ) -> WeightUpdateMeta:
        """A same-host update to ``version`` through ``/update_weights_from_tensor``, in buckets
        of ``bucket_size_mb``, every bucket staged and the last one applying them all."""
        return cls(WeightUpdateType.TENSOR, version, bucket_size_mb=bucket_size_mb,
                   timeout=timeout)

    # The disk-ready marker: the one writer (the trainer) and the one reader (the client).

    @property
    def disk_ready_marker(self) -> str:
        """File the trainer writes (``{"version": v}``) after the HF files of a disk update are
        complete; the client waits for it before asking servers to load ``path``."""
        return os.path.join(self.path or "", DISK_READY_MARKER)

    def write_disk_marker(self) -> None:
        """``{"version": v}`` into ``disk_ready_marker``, durably (fsync) and atomically (temp
        file + rename), so the reader never sees a partial marker."""
        tmp = self.disk_ready_marker + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"version": int(self.version)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.disk_ready_marker)

    def read_disk_marker(self) -> Any:
        """The version the marker holds; raises ``FileNotFoundError`` while it is missing and
        ``ValueError``/``OSError`` when it cannot be read."""
        with open(self.disk_ready_marker) as f:
            return json.load(f).get("version")


class WeightUpdateError(RuntimeError):
    """A weight update failed; ``report`` (when set) says which servers failed and why."""

    report: WeightUpdateReport | None = None


@dataclass
class WeightUpdateReport:
    """What one weight update did to the pool (the client's ``last_weight_update``)."""

    version: int
    updated: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # addr -> reason
    seconds: float = 0.0
    verify_seconds: float = 0.0  # of which checking the servers' checksums (and disk re-syncs)
    # servers whose checksums differed after a broadcast: out of the pool until the trainer
    # re-sends to them (RemoteInferenceEngine.resync_weights)
    resync: list[str] = field(default_factory=list)


class VersionClock:
    """The weight version one trainer rank works at: a single object that the rank's engines
    (actor, rollout clients, staleness gate) share by reference, so ``set_version`` on any of
    them moves it for all and no copy can lag behind. A plain attribute, so the client's hot
    path reads it without a call."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = int(value)


@dataclass
class FinetuneSpec:
    total_train_epochs: int
    dataset_size: int
    train_batch_size: int
    max_train_steps: int | None = None  # a run's ``total_train_steps`` cap: the lr schedule ends there

    @property
    def steps_per_epoch(self) -> int:
        return max(1, self.dataset_size // self.train_batch_size)

    @property
    def total_train_steps(self) -> int:
        steps = self.total_train_epochs * self.steps_per_epoch
        return min(steps, self.max_train_steps) if self.max_train_steps else steps


@dataclass
class SaveLoadMeta:
    """A save or load: HF files (``hf``) or a sharded recovery checkpoint (``dcp``)."""

    path: str
    weight_format: Literal["hf", "dcp"] = "hf"
    with_optim: bool = False
    tokenizer: Any | None = None  # saved beside HF weights when given
    # a vision-language model's processor: its image processor is saved beside HF weights too,
    # so the checkpoint loads with AutoProcessor and serves as a model directory
    processor: Any | None = None
    base_model_path: str | None = None


@dataclass
class RolloutStat:
    """Counters of the rollout executor (see ARCHITECTURE invariants 1 and 6)."""

    submitted: int = 0
    accepted: int = 0
    running: int = 0
    rejected: int = 0
    failed: int = 0

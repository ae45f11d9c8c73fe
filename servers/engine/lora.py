"""Multi-LoRA serving: adapters loaded beside the base model, one batch serving many of them.

An adapter is a peft folder (``adapter_config.json`` + ``adapter_model.safetensors``). Loading
one reads and checks its tensors, then hooks each linear layer it targets (once per layer, the
first time any adapter targets it). Before every forward the engine
names each row's adapter (``set_rows``; None: the base model); a hooked layer adds, for each
adapter in the batch, ``scaling · B(A(x))`` to that adapter's rows only, so requests for
different adapters and for the base model share one continuous batch (SGLang's S-LoRA /
Punica scheme, with plain matmuls).

A loaded adapter never changes. Unloading drops its name (new requests for it get a 400) while
the sequences that started on it keep their reference and finish on it: its tensors are freed
with the last of them. That is what lets a trainer push ``<run>-v<k>`` beside ``<run>-v<k-1>``
without aborting anything.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
TENSOR_PATH = "__tensor__"  # the path SGLang reports for an adapter loaded from tensors


class LoRAError(ValueError):
    """A load, unload or request that names a bad adapter (answered with a 400)."""


@dataclass(eq=False)
class LoRAAdapter:
    name: str
    path: str
    rank: int
    scaling: float
    # module name in the served model -> (A [r, in], B [out, r])
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    pinned: bool = False


def parse_lora_path_arg(spec: str) -> dict[str, Any]:
    """One ``--lora-paths`` entry, as SGLang reads it: ``PATH``, ``NAME=PATH`` or JSON
    ``{"lora_name", "lora_path", "pinned"}``."""
    spec = spec.strip()
    if spec.startswith("{"):
        try:
            d = json.loads(spec)
            return {"lora_name": str(d["lora_name"]), "lora_path": str(d["lora_path"]),
                    "pinned": bool(d.get("pinned", False))}
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"--lora-paths {spec!r}: bad JSON entry ({e})") from None
    if "=" in spec:
        name, path = spec.split("=", 1)
        return {"lora_name": name, "lora_path": path, "pinned": False}
    return {"lora_name": spec, "lora_path": spec, "pinned": False}


def read_adapter(path: str, model: nn.Module, dtype: torch.dtype, device: torch.device,
                 max_rank: int | None = None, target_modules: list[str] | None = None,
                 ) -> tuple[int, float, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """(rank, scaling, weights) of the peft folder at ``path``, checked against ``model``."""
    from safetensors.torch import load_file

    src = Path(path)
    if not (src / ADAPTER_CONFIG).is_file() or not (src / ADAPTER_WEIGHTS).is_file():
        raise LoRAError(f"{path} is not a LoRA adapter folder (needs {ADAPTER_CONFIG} and "
                        f"{ADAPTER_WEIGHTS})")
    try:
        cfg = json.loads((src / ADAPTER_CONFIG).read_text())
        tensors = load_file(str(src / ADAPTER_WEIGHTS))
    except Exception as e:  # noqa: BLE001 - any unreadable file is the caller's bad adapter
        raise LoRAError(f"cannot read the LoRA adapter at {path}: {e}") from None
    return adapter_weights(cfg, tensors, f"LoRA adapter at {path}", model, dtype, device,
                           max_rank, target_modules)


def adapter_weights(cfg: dict[str, Any], tensors: dict[str, torch.Tensor], where: str,
                    model: nn.Module, dtype: torch.dtype, device: torch.device,
                    max_rank: int | None = None, target_modules: list[str] | None = None,
                    ) -> tuple[int, float, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """(rank, scaling, weights) of a peft adapter given as its ``adapter_config.json`` dict and
    its tensors under peft's saved keys, checked against ``model``; ``where`` names it in
    errors. The weights are copies: the caller's tensors may go away."""
    try:
        rank = int(cfg["r"])
        alpha = float(cfg.get("lora_alpha", rank))
    except (KeyError, TypeError, ValueError) as e:
        raise LoRAError(f"{where}: adapter config needs an integer 'r' ({e!r})") from None
    if rank < 1:
        raise LoRAError(f"{where}: rank r must be >= 1, got {rank}")
    if cfg.get("use_rslora") or cfg.get("use_dora"):
        raise LoRAError(f"{where}: rsLoRA/DoRA adapters are not supported")
    if max_rank is not None and rank > max_rank:
        raise LoRAError(f"{where} has rank {rank} > --max-lora-rank {max_rank}")
    modules = dict(model.named_modules())
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        head, _, leaf = key.rpartition(".")  # ...q_proj.lora_A . weight
        mod, _, which = head.rpartition(".")
        if leaf != "weight" or which not in ("lora_A", "lora_B") or \
                not isinstance(t, torch.Tensor):
            raise LoRAError(f"{where}: unexpected tensor {key!r}")
        name = mod.removeprefix("base_model.model.")
        pairs.setdefault(name, {})[which] = t
    weights = {}
    for name, ab in pairs.items():
        base = modules.get(name)
        if not isinstance(base, nn.Linear):
            raise LoRAError(f"{where} targets {name!r}, which is not a linear "
                            "layer of this model")
        leaf = name.rpartition(".")[2]
        if target_modules and leaf not in target_modules:
            raise LoRAError(f"{where} targets {leaf!r}, not in "
                            f"--lora-target-modules {target_modules}")
        a, b = ab.get("lora_A"), ab.get("lora_B")
        if a is None or b is None or a.shape != (rank, base.in_features) or \
                b.shape != (base.out_features, rank):
            raise LoRAError(f"{where}: {name} needs lora_A [{rank}, "
                            f"{base.in_features}] and lora_B [{base.out_features}, {rank}]")
        weights[name] = (a.to(device=device, dtype=dtype, copy=True),
                         b.to(device=device, dtype=dtype, copy=True))
    if not weights:
        raise LoRAError(f"{where} holds no lora_A/lora_B tensors")
    return rank, alpha / rank, weights


class _BatchRows:
    """Which rows of the current forward use which adapter (shared by every wrapped layer)."""

    def __init__(self) -> None:
        self.groups: list[tuple[LoRAAdapter, torch.Tensor]] = []


class _LoRAHook:
    """Forward hook of one linear layer: adds each batch adapter's delta to its own rows. A
    hook, not a wrapper module, so the model's parameter names stay the base model's (full
    weight updates, checksums and ``get_weights_by_name`` see no difference)."""

    def __init__(self, name: str, rows: _BatchRows) -> None:
        self.name = name
        self._rows = rows

    def __call__(self, module: nn.Module, args: tuple, y: torch.Tensor) -> torch.Tensor:
        x = args[0]
        for adapter, idx in self._rows.groups:
            ab = adapter.weights.get(self.name)
            if ab is None:
                continue
            a, b = ab
            xs = x if idx is None else x.index_select(0, idx)
            delta = (xs @ a.t()) @ b.t() * adapter.scaling
            y = y + delta if idx is None else y.index_add(0, idx, delta)
        return y


class LoRAManager:
    """The adapters a server holds, by name, and the hooked layers that run them."""

    def __init__(self, model: nn.Module, max_loras_per_batch: int = 8,
                 max_lora_rank: int | None = None, target_modules: list[str] | None = None):
        self.model = model
        self.max_loras_per_batch = max_loras_per_batch
        self.max_lora_rank = max_lora_rank
        self.target_modules = target_modules or None
        self.adapters: dict[str, LoRAAdapter] = {}
        self._rows = _BatchRows()
        self._wrapped: set[str] = set()
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device

    def read(self, name: str, path: str, pinned: bool = False) -> LoRAAdapter:
        """Read and check an adapter (any thread; touches nothing the engine uses)."""
        if not name:
            raise LoRAError("lora_name must not be empty")
        if name in self.adapters:
            raise LoRAError(f"The LoRA adapter {name!r} is already loaded")
        rank, scaling, weights = read_adapter(path, self.model, self.dtype, self.device,
                                              self.max_lora_rank, self.target_modules)
        return LoRAAdapter(name, path, rank, scaling, weights, pinned)

    def from_tensors(self, name: str, cfg: dict[str, Any], tensors: dict[str, torch.Tensor],
                     pinned: bool = False) -> LoRAAdapter:
        """An adapter handed over in memory (``/load_lora_adapter_from_tensors``), checked and
        copied; its path reads ``__tensor__``, as SGLang reports it."""
        if not name:
            raise LoRAError("lora_name must not be empty")
        if name in self.adapters:
            raise LoRAError(f"The LoRA adapter {name!r} is already loaded")
        rank, scaling, weights = adapter_weights(
            cfg, tensors, f"LoRA adapter {name!r}", self.model, self.dtype, self.device,
            self.max_lora_rank, self.target_modules)
        return LoRAAdapter(name, TENSOR_PATH, rank, scaling, weights, pinned)

    def install(self, adapter: LoRAAdapter) -> None:
        """Register a read adapter and hook the layers it needs (engine thread)."""
        if adapter.name in self.adapters:
            raise LoRAError(f"The LoRA adapter {adapter.name!r} is already loaded")
        for name in adapter.weights:
            if name not in self._wrapped:
                layer = self.model.get_submodule(name)
                layer.register_forward_hook(_LoRAHook(name, self._rows))
                self._wrapped.add(name)
        self.adapters[adapter.name] = adapter

    def unload(self, name: str) -> LoRAAdapter:
        """Drop ``name``; sequences already on it finish on it (they hold the adapter)."""
        adapter = self.adapters.pop(name, None)
        if adapter is None:
            raise LoRAError(f"LoRA with name {name} does not exist. Loaded LoRAs: "
                            f"{sorted(self.adapters)}")
        return adapter

    def resolve(self, name: str | None) -> LoRAAdapter | None:
        if name is None:
            return None
        adapter = self.adapters.get(name)
        if adapter is None:
            raise LoRAError(f"Got LoRA adapter that has never been loaded: {name}. Loaded "
                            f"LoRAs: {sorted(self.adapters)}")
        return adapter

    def loaded(self) -> dict[str, str]:
        """name -> path (SGLang's ``loaded_adapters``)."""
        return {n: a.path for n, a in self.adapters.items()}

    def set_rows(self, adapters: list[LoRAAdapter | None]) -> None:
        """Name each row's adapter for the next forward (engine thread)."""
        groups: dict[LoRAAdapter, list[int]] = {}
        for i, a in enumerate(adapters):
            if a is not None:
                groups.setdefault(a, []).append(i)
        n = len(adapters)
        dev = self.device
        self._rows.groups = [
            (a, None if len(rows) == n else torch.tensor(rows, device=dev))
            for a, rows in groups.items()
        ]


def enable_lora(runner: Any, args: Any) -> LoRAManager:
    """Give ``runner`` a LoRA manager from the launch flags and load ``--lora-paths``
    (before the engine starts: no other thread uses the model yet)."""
    mgr = LoRAManager(runner.model, args.max_loras_per_batch, args.max_lora_rank,
                      list(args.lora_target_modules))
    for spec in args.lora_paths:
        entry = parse_lora_path_arg(spec)
        mgr.install(mgr.read(entry["lora_name"], entry["lora_path"], entry["pinned"]))
    runner.lora = mgr
    return mgr


def request_adapters(mgr: LoRAManager | None, lora_path: Any, num: int) -> list[LoRAAdapter | None]:
    """The adapter of each of a ``/generate`` call's ``num`` sequences (prompt-major) from its
    ``lora_path``: one name for all, or one per prompt (None: the base model). Raises
    ``LoRAError`` naming the bad adapter."""
    if lora_path is None:
        return [None] * num
    if mgr is None:
        raise LoRAError(f"lora_path {lora_path!r} given but {NOT_ENABLED}")
    if isinstance(lora_path, str):
        return [mgr.resolve(lora_path)] * num
    if not isinstance(lora_path, list) or not lora_path or num % len(lora_path):
        raise LoRAError("lora_path should be a string or a list with one entry per prompt")
    per = num // len(lora_path)
    found = [mgr.resolve(p) if isinstance(p, str) or p is None else _bad(p) for p in lora_path]
    return [found[i // per] for i in range(num)]


def openai_lora_path(model: str, served_name: str, lora_path: Any) -> Any:
    """The adapter an OpenAI-route request (``/v1/completions``, ``/v1/chat/completions``) runs
    on, as SGLang resolves it: ``model`` = ``"<base>:<adapter>"`` names the adapter (the served
    name is matched whole first, so a served name holding a colon is still the base model),
    else the body's own ``lora_path`` (SGLang's extra field), else None (the base model). A bare
    adapter name in ``model`` is the base model on SGLang, so it is here too."""
    if ":" in model and model != served_name:
        if model.startswith(f"{served_name}:"):
            adapter = model[len(served_name) + 1:]
        else:
            adapter = model.split(":", 1)[1]
        if adapter.strip():
            return adapter.strip()
    return lora_path


def _bad(p: Any) -> None:
    raise LoRAError(f"lora_path entries must be adapter names, got {p!r}")


NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."

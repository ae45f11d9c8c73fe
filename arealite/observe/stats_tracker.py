"""A distributed statistics tracker: masked token statistics and scalars, reduced across ranks.

Usage (the module-level functions act on a default tracker; ``StatsTracker()`` makes others)::

    from arealite.observe import stats_tracker

    with stats_tracker.scope("ppo_actor"):
        stats_tracker.denominator(n_tokens=loss_mask, n_seqs=seq_mask)
        stats_tracker.stat(denominator="n_tokens", importance_weight=ratio, approx_kl=kl)
        stats_tracker.scalar(lr=lr, grad_norm=gn)
    stats = stats_tracker.export()   # {"ppo_actor/approx_kl/avg": ..., "ppo_actor/n_tokens": ...}

Why the reduction is "sum of masked sums / sum of counts": ranks (and micro-batches) hold
different numbers of tokens, so averaging per-rank means would weight a token on a short rank
more than one on a long rank. Every statistic is therefore carried as (sum, count, min, max) and
all-reduced with SUM/SUM/MIN/MAX before dividing.

Key sets may differ between ranks (a rank that rejected every episode has no reward stat); the
union of keys is agreed first so the collectives always match and no rank hangs.
"""

from __future__ import annotations

import contextlib
import enum
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

__all__ = [
    "ReduceType", "StatsTracker", "DEFAULT_TRACKER", "get_tracker",
    "scope", "denominator", "stat", "scalar", "export",
]


class ReduceType(str, enum.Enum):
    """How a key is reduced over calls and ranks.

    ``AVG_MIN_MAX`` exports ``key/avg``, ``key/min`` and ``key/max``; the others export ``key``.
    ``SUM_PER_RANK`` sums the values recorded on each rank, then averages over ranks: the right
    reduction for per-step phase timings, which every rank measures for itself.
    """

    AVG_MIN_MAX = "avg_min_max"
    AVG = "avg"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    SUM_PER_RANK = "sum_per_rank"


@dataclass
class _Acc:
    """Running (sum, count, min, max) of one key on this rank."""

    reduce_type: ReduceType
    total: float = 0.0
    count: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf
    tensors: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=list
    )  # (sum, count, min, max) 0-dim tensors: no device sync per call on GPU

    def add_scalar(self, v: float) -> None:
        self.total += v
        self.count += 1
        self.lo = min(self.lo, v)
        self.hi = max(self.hi, v)

    def local(self) -> tuple[float, float, float, float]:
        total, count, lo, hi = self.total, self.count, self.lo, self.hi
        if self.tensors:
            s, c, mn, mx = (torch.stack(x).double().cpu() for x in zip(*self.tensors))
            total += float(s.sum())
            count += float(c.sum())
            lo = min(lo, float(mn.min()))
            hi = max(hi, float(mx.max()))
        return total, count, lo, hi


def _check_name(name: str) -> None:
    if not name or "/" in name:
        raise ValueError(f"stat name must be non-empty and contain no '/': {name!r}")


class StatsTracker:
    """Collects statistics between two ``export`` calls; see the module docstring.

    ``name`` is a label (``get_tracker(name)``); keys are not prefixed with it: use ``scope``."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._scopes: list[str] = []
        self._denominators: dict[str, torch.Tensor] = {}
        self._accs: dict[str, _Acc] = {}

    # ------------------------------------------------------------------ recording
    def _key(self, name: str) -> str:
        return "/".join([*self._scopes, name])

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix every key recorded inside with ``name/`` (scopes nest)."""
        if not name:
            raise ValueError("scope name must be non-empty")
        self._scopes.append(name.strip("/"))
        try:
            yield
        finally:
            self._scopes.pop()

    def _acc(self, key: str, reduce_type: ReduceType) -> _Acc:
        acc = self._accs.get(key)
        if acc is None:
            acc = self._accs[key] = _Acc(ReduceType(reduce_type))
        elif acc.reduce_type != reduce_type:
            raise ValueError(f"stat {key!r} recorded with {acc.reduce_type.value} and "
                             f"{ReduceType(reduce_type).value}")
        return acc

    def denominator(self, **masks: torch.Tensor) -> None:
        """Register boolean masks that later ``stat`` calls in this scope average over.
        Each mask's element count (summed over calls and ranks) is exported under its name."""
        for name, mask in masks.items():
            _check_name(name)
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                raise TypeError(f"denominator {name!r} must be a bool tensor")
            key = self._key(name)
            self._denominators[key] = mask
            acc = self._acc(key, ReduceType.SUM)
            acc.tensors.append((mask.sum(), torch.ones((), device=mask.device),
                                mask.sum(), mask.sum()))

    def stat(
        self,
        denominator: str,
        reduce_type: ReduceType = ReduceType.AVG_MIN_MAX,
        **tensors: torch.Tensor,
    ) -> None:
        """Record element-wise values where the named mask (same scope, same shape) is True."""
        dkey = self._key(denominator)
        if dkey not in self._denominators:
            raise KeyError(f"no denominator {dkey!r}; call denominator({denominator}=mask) first")
        mask = self._denominators[dkey]
        if reduce_type == ReduceType.SUM_PER_RANK:
            raise ValueError("SUM_PER_RANK is for scalars, not masked stats")
        for name, value in tensors.items():
            _check_name(name)
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"stat {name!r} must be a tensor (use scalar() for numbers)")
            if value.shape != mask.shape:
                raise ValueError(f"stat {name!r} has shape {tuple(value.shape)} but denominator "
                                 f"{denominator!r} has shape {tuple(mask.shape)}")
            v = value.detach().to(torch.float64)
            m = mask.to(v.device)
            n = m.sum()
            s = torch.where(m, v, torch.zeros_like(v)).sum()
            lo = torch.where(m, v, torch.full_like(v, math.inf)).min() if v.numel() else v.new_tensor(math.inf)
            hi = torch.where(m, v, torch.full_like(v, -math.inf)).max() if v.numel() else v.new_tensor(-math.inf)
            self._acc(self._key(name), reduce_type).tensors.append((s, n.to(s.dtype), lo, hi))

    def scalar(self, reduce_type: ReduceType = ReduceType.AVG, **values: float) -> None:
        """Record one observation per keyword (mean over observations and ranks by default)."""
        for name, value in values.items():
            _check_name(name)
            v = float(value.item() if isinstance(value, torch.Tensor) else value)
            self._acc(self._key(name), reduce_type).add_scalar(v)

    def count_values(self, name: str, values: torch.Tensor | list[int]) -> None:
        """A histogram of integer values (e.g. per-trajectory staleness): ``name/<v>`` is the
        number of occurrences of ``v``, summed over calls and ranks."""
        _check_name(name)
        t = torch.as_tensor(values).flatten()
        if t.is_floating_point() or t.dtype == torch.bool:
            raise TypeError(f"count_values({name!r}) needs integer values")
        uniq, counts = torch.unique(t.cpu(), return_counts=True)
        with self.scope(name):
            for v, c in zip(uniq.tolist(), counts.tolist()):
                self.scalar(reduce_type=ReduceType.SUM, **{str(v): float(c)})

    # ------------------------------------------------------------------ export
    def export(self, reduce_group=None, reset: bool = True) -> dict[str, float]:
        """Reduce everything recorded (across ranks when torch.distributed is initialised) into
        ``{key: float}``; keys with nothing counted are left out. ``reduce_group`` is the
        process group to reduce over (default: the world). Collective: every rank must call."""
        import torch.distributed as dist

        # a group of one has nothing to agree on or reduce
        distributed = (dist.is_available() and dist.is_initialized()
                       and dist.get_world_size(reduce_group) > 1)
        local_types = {k: a.reduce_type.value for k, a in self._accs.items()}
        if distributed:
            gathered: list[dict[str, str] | None] = [None] * dist.get_world_size(reduce_group)
            dist.all_gather_object(gathered, local_types, group=reduce_group)
            types: dict[str, str] = {}
            for g in gathered:
                for k, t in (g or {}).items():
                    if types.setdefault(k, t) != t:
                        raise ValueError(f"stat {k!r} has different reduce types across ranks")
            world = dist.get_world_size(reduce_group)
        else:
            types, world = local_types, 1
        keys = sorted(types)
        empty = (0.0, 0.0, math.inf, -math.inf)
        local = [self._accs[k].local() if k in self._accs else empty for k in keys]
        sums = torch.tensor([[x[0], x[1]] for x in local], dtype=torch.float64).reshape(-1, 2)
        los = torch.tensor([x[2] for x in local], dtype=torch.float64)
        his = torch.tensor([x[3] for x in local], dtype=torch.float64)
        if distributed and keys:
            device = _reduce_device(dist, reduce_group)
            sums, los, his = (t.to(device) for t in (sums, los, his))
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=reduce_group)
            dist.all_reduce(los, op=dist.ReduceOp.MIN, group=reduce_group)
            dist.all_reduce(his, op=dist.ReduceOp.MAX, group=reduce_group)
            sums, los, his = sums.cpu(), los.cpu(), his.cpu()
        out: dict[str, float] = {}
        for i, key in enumerate(keys):
            total, count = float(sums[i, 0]), float(sums[i, 1])
            if count == 0:
                continue
            rt = ReduceType(types[key])
            if rt == ReduceType.AVG_MIN_MAX:
                out[f"{key}/avg"] = total / count
                out[f"{key}/min"] = float(los[i])
                out[f"{key}/max"] = float(his[i])
            elif rt == ReduceType.AVG:
                out[key] = total / count
            elif rt == ReduceType.SUM:
                out[key] = total
            elif rt == ReduceType.MIN:
                out[key] = float(los[i])
            elif rt == ReduceType.MAX:
                out[key] = float(his[i])
            else:  # SUM_PER_RANK
                out[key] = total / world
        if reset:
            self.reset()
        return out

    def reset(self) -> None:
        self._denominators.clear()
        self._accs.clear()


def _reduce_device(dist, group) -> torch.device:
    """Collectives need tensors on the backend's device: CPU for gloo, the current GPU for nccl."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


DEFAULT_TRACKER = StatsTracker()
_TRACKERS: dict[str, StatsTracker] = defaultdict(StatsTracker)
_TRACKERS[""] = DEFAULT_TRACKER


def get_tracker(name: str = "") -> StatsTracker:
    """The process-wide tracker called ``name`` (``""`` is the default one)."""
    t = _TRACKERS[name]
    t.name = name
    return t


scope = DEFAULT_TRACKER.scope
denominator = DEFAULT_TRACKER.denominator
stat = DEFAULT_TRACKER.stat
scalar = DEFAULT_TRACKER.scalar
export = DEFAULT_TRACKER.export

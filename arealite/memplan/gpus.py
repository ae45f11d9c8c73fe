"""The accelerators a plan can be made for: name -> device memory (what
``torch.cuda.get_device_properties(0).total_memory`` reports, in GiB as sold), and the share
of it a plan may fill."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


# Marketing "80 GB" cards expose about 79.3 GiB to CUDA; the table keeps the sold figure in GiB
# and the margin below absorbs the difference.
GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("H100-80GB", 80.0),
    GPU("H100-94GB", 94.0),
    GPU("H200-141GB", 141.0),
    GPU("A100-40GB", 40.0),
    GPU("A100-80GB", 80.0),
    GPU("L40S-48GB", 48.0),
    GPU("A10G-24GB", 24.0),
    GPU("RTX4090-24GB", 24.0),
    GPU("MI300X-192GB", 192.0),
    GPU("B200-180GB", 180.0),
)}

# A prediction counts the bytes torch allocates (max_memory_allocated). The margin covers what it
# does not: the CUDA context and kernels (~0.5-1 GiB), NCCL's buffers, the caching allocator's
# fragmentation. A plan fits when its peak is at most (1 - MARGIN) of the device's memory.
MARGIN = 0.10


def usable_bytes(gpu: GPU, margin: float = MARGIN) -> int:
    return int(gpu.memory_bytes * (1.0 - margin))


def find_gpu(name: str) -> GPU:
    """The table's entry for ``name`` (case and punctuation ignored; "H100" alone is the 80 GB
    card); a ValueError listing the table otherwise."""
    def key(s: str) -> str:
        return "".join(c for c in s.lower() if c.isalnum())

    want = key(name)
    for g in GPUS.values():
        if key(g.name) == want:
            return g
    short = [g for g in GPUS.values() if key(g.name).startswith(want)]
    if short:
        return short[0]  # the table lists each family's common card first
    size = name.strip().lower().removesuffix("gib").strip()
    try:  # an accelerator not in the table, by its memory: "24GiB"
        if name.strip().lower().endswith("gib") and float(size) > 0:
            return GPU(name.strip(), float(size))
    except ValueError:
        pass
    raise ValueError(f"unknown GPU {name!r}: one of {', '.join(GPUS)}, or a size such as "
                     "'24GiB'")

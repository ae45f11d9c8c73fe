"""Shared-memory blocks of ``/update_weights_from_tensor`` pushes kept mapped between pushes.

A CPU payload names shared-memory blocks (``servers/weights/tensor_payload.py``). Opening a block costs
a round trip to torch's shared-memory manager, an ``mmap``, a page fault on every 4 KiB page the
copy reads and an ``munmap`` when the last reference goes: measured on a 200 MB model, more
than the copy itself. A co-located trainer of one rank sends the same blocks every time (its
parameters live in them; the optimizer updates them in place), so the server keeps them mapped:
torch's receiving side looks a block up by name in its ``shared_cache`` first and, while a
reference lives here, reuses the mapping (pages already in this process's page tables) and
only consumes the sender's reference count, as an unpickled block always does.

Which blocks are held: only those named by two consecutive updates (a sender's long-lived
blocks, which cost no memory beyond the sender's own). A block seen once (a sender that builds
new blocks per push, e.g. gathered copies of sharded parameters) is never held, so the server
keeps no memory alive for it; a held block that an update no longer names is let go. CUDA
tensors are never held (their IPC mappings would pin the trainer's device memory).
"""

from __future__ import annotations

import torch

from servers.weights.tensor_payload import NamedTensors


def shared_block(t: torch.Tensor) -> tuple[bytes, torch.UntypedStorage] | None:
    """``(block name, storage)`` of a CPU tensor in a file-system shared-memory block."""
    if t.device.type != "cpu" or not t.is_shared():
        return None
    s = t.untyped_storage()
    if s.nbytes() == 0:
        return None
    # already shared by file name: this only reads the name (it never moves a storage)
    return s._share_filename_cpu_()[1], s


class SharedSources:
    """The blocks held between pushes; used from the engine thread only."""

    def __init__(self) -> None:
        self.held: dict[bytes, torch.UntypedStorage] = {}
        self._previous: set[bytes] = set()  # names the last completed update used
        self._current: set[bytes] = set()  # names the update under way uses so far

    def note(self, named: NamedTensors) -> None:
        """Record the blocks that one applied or staged call of the current update names."""
        for _, t in named:
            got = shared_block(t)
            if got is None:
                continue
            name, storage = got
            self._current.add(name)
            if name in self._previous:
                self.held[name] = storage

    def update_done(self) -> None:
        """The current update is applied: let go of held blocks it did not name."""
        self.held = {k: s for k, s in self.held.items() if k in self._current}
        self._previous, self._current = self._current, set()

    def update_dropped(self) -> None:
        """The current update was abandoned (refused or cut short): forget what it named."""
        self._current = set()

    def held_bytes(self) -> int:
        return sum(s.nbytes() for s in self.held.values())

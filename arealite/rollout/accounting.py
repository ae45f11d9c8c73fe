"""What became of the run's trajectories, counted for the executor: the serial of each launched
episode, the trajectories dropped at consumption as stale and the generated tokens they held,
the tokens trained, and generated against trained sequence lengths (the length-bias counters,
``observe/length_bias.py``), plus the generated lengths and rewards since the last
``take_generated`` (the length-bias stats' other side).

The counts go on across restarts: ``state``/``load_state`` are saved with the data state
(``data_cycle.py``), so ``rollout/{episodes,stale,...}`` never go back and episode serials stay
unique over the whole run. The executor calls these under its own lock where it needs one;
rows redrawn or dropped after failures are the data cycle's count (``DataCycle``), not these.
"""

from __future__ import annotations

from typing import Any

from arealite.observe.length_bias import generated_lengths
from arealite.rollout.staleness import generated_tokens

# generated lengths and rewards kept for take_generated; nobody taking them (a caller without
# the stats) must not grow memory without bound
KEEP_GENERATED = 4096


class RolloutAccounts:
    def __init__(self) -> None:
        self.episodes = 0  # episodes launched over the whole run: the next serial
        self.stale = 0
        self.tokens = {"stale_tokens": 0, "trained_tokens": 0}  # generated tokens, by fate
        # every finished trajectory's rows, whatever their fate, against the trained ones
        self.seqs = {"gen_seqs": 0, "gen_tokens": 0, "trained_seqs": 0, "trained_gen_tokens": 0}
        self._generated: list[tuple[list[int], list[float]]] = []

    def next_serial(self) -> int:
        """The serial number of the episode being launched now."""
        serial, self.episodes = self.episodes, self.episodes + 1
        return serial

    def finished(self, traj: Any) -> None:
        """A finished trajectory's rows: generated lengths and rewards."""
        lens = generated_lengths(traj)
        if not lens:
            return
        rw = traj.get("rewards")
        self._generated.append((lens, [] if rw is None else rw.reshape(-1).float().tolist()))
        self.seqs["gen_seqs"] += len(lens)
        self.seqs["gen_tokens"] += int(sum(lens))
        if len(self._generated) > KEEP_GENERATED:
            del self._generated[: KEEP_GENERATED // 2]

    def dropped_stale(self, traj: Any) -> None:
        self.stale += 1
        self.tokens["stale_tokens"] += generated_tokens(traj)

    def trained(self, traj: Any) -> None:
        """A trajectory in a final batch (counted once the batch is final: see the executor)."""
        self.tokens["trained_tokens"] += generated_tokens(traj)
        lens = generated_lengths(traj)
        self.seqs["trained_seqs"] += len(lens)
        self.seqs["trained_gen_tokens"] += sum(lens)

    def take_generated(self) -> tuple[list[int], list[float]]:
        """Generated lengths and rewards of the trajectories finished since the previous call
        (trained, dropped as stale or turned down alike)."""
        items, self._generated = self._generated, []
        return [n for lens, _ in items for n in lens], [r for _, rw in items for r in rw]

    def state(self) -> dict[str, int]:
        return {"episodes": self.episodes, "stale": self.stale, **self.tokens, **self.seqs}

    def load_state(self, state: dict[str, int]) -> None:
        self.episodes = int(state.get("episodes", 0))
        self.stale = int(state.get("stale", 0))
        for d in (self.tokens, self.seqs):
            for k in d:
                d[k] = int(state.get(k, 0))

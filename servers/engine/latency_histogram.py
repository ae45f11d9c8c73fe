"""The engine's two latency histograms (time to first token, end-to-end), with SGLang's
default buckets: filled by the engine thread once per finished request, read by ``/metrics``
(``servers.routes.metrics`` renders them for Prometheus). Here, below both, so the engine
never imports a route.
"""

from __future__ import annotations

import bisect
import threading

# SGLang's default buckets for time to first token and end-to-end latency (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
               100.0, 200.0, 400.0)


class LatencyHistogram:
    """Bucket counts and a sum, filled by the engine thread once per request and read
    by a scrape (a lock: a scrape never sees a bucket ahead of the total)."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.bounds = buckets
        self._counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf only)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, v: float) -> None:
        i = bisect.bisect_left(self.bounds, v)  # the first bound >= v; len(): +Inf only
        with self._lock:
            self._counts[i] += 1
            self._sum += v

    def snapshot(self) -> tuple[list[int], float]:
        """Per-bucket counts (not cumulative; the last above every bound) and the sum."""
        with self._lock:
            return list(self._counts), self._sum

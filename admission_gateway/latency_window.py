"""Percentiles of recent latencies, in bounded memory.

The control plane judges tenants by how they are served now, not since start-up, so a gateway
reports percentiles over a sliding window: the last `max_samples` observations that are at most
`max_age_s` old. Latencies are observed in seconds (the gateway times requests on a monotonic
clock in seconds) and summarised in milliseconds, the unit of the data path from here to the
policy (slotshift.demand.LatencySummary): this summary is the one place that converts. Pure
stdlib; time comes from an injected Clock.
"""

from __future__ import annotations

import math
from collections import deque

from slotshift.clock import Clock
from slotshift.demand import LatencySummary

_MS_PER_S = 1000.0


class LatencyWindow:
    """The most recent latency observations, by count and by age."""

    def __init__(self, clock: Clock, *, max_samples: int = 1024, max_age_s: float = 60.0) -> None:
        if max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {max_samples}")
        if max_age_s <= 0:
            raise ValueError(f"max_age_s must be positive, got {max_age_s}")
        self._clock = clock
        self._max_age_s = max_age_s
        # (observed at, value); appended in clock order, so the oldest is always on the left.
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def observe(self, seconds: float) -> None:
        """Record one latency, in seconds (negative values, from clock skew, count as 0)."""
        self._samples.append((self._clock.monotonic(), max(0.0, seconds)))

    def __len__(self) -> int:
        self._forget_old()
        return len(self._samples)

    def percentiles(self) -> LatencySummary:
        """p50/p90/p99 by nearest rank over the observations still in the window, in
        milliseconds; an empty window gives count 0 and all percentiles 0."""
        self._forget_old()
        if not self._samples:
            return LatencySummary()
        values = sorted(value for _, value in self._samples)
        return LatencySummary(
            count=len(values),
            p50_ms=_nearest_rank(values, 0.50) * _MS_PER_S,
            p90_ms=_nearest_rank(values, 0.90) * _MS_PER_S,
            p99_ms=_nearest_rank(values, 0.99) * _MS_PER_S,
        )

    def _forget_old(self) -> None:
        horizon = self._clock.monotonic() - self._max_age_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()


def _nearest_rank(sorted_values: list[float], quantile: float) -> float:
    rank = max(1, math.ceil(quantile * len(sorted_values)))
    return sorted_values[rank - 1]

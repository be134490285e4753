"""Percentiles of recent latencies, in bounded memory.

The control plane judges tenants by how they are served now, not since start-up, so a gateway
reports percentiles over a sliding window: the last `max_samples` observations that are at most
`max_age_s` old. Latencies are observed in seconds (the gateway times requests on a monotonic
clock in seconds) and summarised in milliseconds, the unit of the data path from here to the
policy (slotshift.demand.LatencySummary): this summary is the one place that converts. Pure
stdlib; time comes from an injected Clock.
"""

from __future__ import annotations

import bisect
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
        self._max_samples = max_samples
        self._max_age_s = max_age_s
        # Each observation's time and value, oldest on the left (appended in clock order), and
        # the same values kept sorted: a report reads every window, so the percentiles are
        # ranks looked up, not a sort (an observation costs a binary search and a move).
        self._times: deque[float] = deque()
        self._values: deque[float] = deque()
        self._sorted: list[float] = []
        self._summary: LatencySummary | None = None
        """The percentiles of the window as it is, until it changes."""

    def observe(self, seconds: float) -> None:
        """Record one latency, in seconds (negative values, from clock skew, count as 0)."""
        if len(self._values) >= self._max_samples:
            self._drop_oldest()
        value = max(0.0, seconds)
        self._times.append(self._clock.monotonic())
        self._values.append(value)
        bisect.insort(self._sorted, value)
        self._summary = None

    def __len__(self) -> int:
        self._forget_old()
        return len(self._values)

    def percentiles(self) -> LatencySummary:
        """p50/p90/p99 by nearest rank over the observations still in the window, in
        milliseconds; an empty window gives count 0 and all percentiles 0."""
        self._forget_old()
        if self._summary is not None:
            return self._summary
        values = self._sorted
        if not values:
            summary = LatencySummary()
        else:
            summary = LatencySummary(
                count=len(values),
                p50_ms=_nearest_rank(values, 0.50) * _MS_PER_S,
                p90_ms=_nearest_rank(values, 0.90) * _MS_PER_S,
                p99_ms=_nearest_rank(values, 0.99) * _MS_PER_S,
            )
        self._summary = summary
        return summary

    def _forget_old(self) -> None:
        horizon = self._clock.monotonic() - self._max_age_s
        times = self._times
        while times and times[0] < horizon:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        self._times.popleft()
        value = self._values.popleft()
        del self._sorted[bisect.bisect_left(self._sorted, value)]
        self._summary = None


def _nearest_rank(sorted_values: list[float], quantile: float) -> float:
    rank = max(1, math.ceil(quantile * len(sorted_values)))
    return sorted_values[rank - 1]

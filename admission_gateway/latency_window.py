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
        # When each observation was made, and its value, in two deques kept in step (both drop
        # their oldest at max_samples): appended in clock order, so the oldest is on the left.
        # The values apart, sorting them is one C call (a report sorts every window).
        self._times: deque[float] = deque(maxlen=max_samples)
        self._values: deque[float] = deque(maxlen=max_samples)
        self._summary: LatencySummary | None = None
        """The percentiles of the window as it is, until it changes."""

    def observe(self, seconds: float) -> None:
        """Record one latency, in seconds (negative values, from clock skew, count as 0)."""
        self._times.append(self._clock.monotonic())
        self._values.append(max(0.0, seconds))
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
        if not self._values:
            summary = LatencySummary()
        else:
            values = sorted(self._values)
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
            times.popleft()
            self._values.popleft()
            self._summary = None


def _nearest_rank(sorted_values: list[float], quantile: float) -> float:
    rank = max(1, math.ceil(quantile * len(sorted_values)))
    return sorted_values[rank - 1]

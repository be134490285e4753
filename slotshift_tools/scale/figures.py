"""The figures of one point, from what the control plane and the generators recorded (pure).

Times are wall-clock seconds: the control plane stamps its decisions with its wall clock and the
generators stamp their events with theirs, one host, one clock.

- decision duration: the control plane's own `duration_ms` (GetDecisions): the policy, the
  reserve rule, validation and the publication of the allocation (re-split and grants);
- decision -> acknowledged: for each decision that published new limits (outcome published) in
  the window, the time from its `decided_at` (stamped as it returns, after the allocation was
  handed to the gateways' mailboxes) until every gateway had sent the acknowledgement of that
  version or of a later one (a later one supersedes it: the control plane drops unsent older
  versions); a decision some gateway never acknowledged before the end is counted apart;
- missed periods: over the window, each gap between consecutive decisions (and between the
  window's ends and the first and last decisions) of g seconds counts floor(g / period - 0.5)
  missed decisions: a gap of about two periods is one decision missed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from slotshift_tools.bench.stats import percentile

PUBLISHED = "published"
PERIOD_TRIGGER = "period"


@dataclass(frozen=True)
class DecisionTimes:
    """What the benchmark keeps of one decision."""

    id: int
    decided_at_wall_s: float
    duration_ms: float
    outcome: str
    """"published", "held" or "rejected"."""
    trigger: str
    """"period", or the fast path's reason."""
    version: int
    """The allocation version in force after the decision."""


@dataclass(frozen=True)
class Window:
    """The measured window, wall-clock seconds."""

    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s

    def holds(self, wall_s: float) -> bool:
        return self.start_s <= wall_s <= self.end_s


def summary_ms(values_ms: Iterable[float]) -> dict[str, float | int | None]:
    """count, p50, p99 and max of values in milliseconds (None each when there are none)."""
    ordered = sorted(values_ms)
    if not ordered:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "count": len(ordered),
        "p50_ms": percentile(ordered, 50),
        "p99_ms": percentile(ordered, 99),
        "max_ms": ordered[-1],
    }


def missed_periods(times_s: Sequence[float], window: Window, period_s: float) -> int:
    """Decisions missed in the window, counted from the gaps between decisions (module doc)."""
    inside = sorted(t for t in times_s if window.holds(t))
    edges = [window.start_s, *inside, window.end_s]
    return sum(max(0, math.floor((b - a) / period_s - 0.5)) for a, b in itertools.pairwise(edges))


def decision_figures(
    decisions: Iterable[DecisionTimes], window: Window, period_s: float
) -> dict[str, object]:
    """How many decisions the window held, how long they took, and how many were missed."""
    inside = sorted((d for d in decisions if window.holds(d.decided_at_wall_s)), key=lambda d: d.id)
    times = [d.decided_at_wall_s for d in inside]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "made": len(inside),
        "period_triggered": sum(1 for d in inside if d.trigger == PERIOD_TRIGGER),
        "fast_path": sum(1 for d in inside if d.trigger != PERIOD_TRIGGER),
        "published": sum(1 for d in inside if d.outcome == PUBLISHED),
        "rejected": sum(1 for d in inside if d.outcome == "rejected"),
        "period_s": period_s,
        "periods_elapsed": window.length_s / period_s,
        "missed_periods": missed_periods(times, window, period_s),
        "max_gap_s": max(gaps) if gaps else None,
        "duration": summary_ms(d.duration_ms for d in inside),
    }


@dataclass(frozen=True)
class AckTimes:
    """One gateway's acknowledgements: versions (increasing) and when each ack was sent."""

    versions: npt.NDArray[np.int64]
    sent_wall_s: npt.NDArray[np.float64]


def acknowledged_latencies(
    decisions: Iterable[DecisionTimes], acks: Mapping[str, AckTimes], window: Window
) -> tuple[list[float], int]:
    """Seconds from each published decision in the window until every gateway it changed has
    acknowledged it; and how many published decisions of the window changed no gateway's
    limits before the next one (or by the end of the run).

    The control plane sends a version only to the gateways whose part changed, and may carry a
    decision's change in a later re-grant (as slots drain). So a decision at version v, the next
    published one at v', is acknowledged at a gateway by its first ack of a version in [v, v');
    a gateway with none needed nothing from it.
    """
    published = sorted((d for d in decisions if d.outcome == PUBLISHED), key=lambda d: d.version)
    latencies: list[float] = []
    unacknowledged = 0
    for decision, following in itertools.zip_longest(published, published[1:]):
        if not window.holds(decision.decided_at_wall_s):
            continue
        upto = math.inf if following is None else following.version
        latest = -math.inf
        for times in acks.values():
            index = int(np.searchsorted(times.versions, decision.version, side="left"))
            if index < len(times.versions) and times.versions[index] < upto:
                latest = max(latest, float(times.sent_wall_s[index]))
        if math.isinf(latest):
            unacknowledged += 1
            continue
        # An ack a hair before decided_at is the same instant seen by two processes: 0.
        latencies.append(max(0.0, latest - decision.decided_at_wall_s))
    return latencies, unacknowledged


def per_gateway_rate(times_s: Iterable[float], window: Window, gateways: int) -> float:
    """Events in the window per gateway per second."""
    count = sum(1 for t in times_s if window.holds(t))
    return count / gateways / window.length_s


def per_gateway_bytes_rate(
    times_s: Sequence[float], sizes: Sequence[int], window: Window, gateways: int
) -> float:
    """Bytes of the events in the window per gateway per second."""
    total = sum(size for t, size in zip(times_s, sizes, strict=True) if window.holds(t))
    return total / gateways / window.length_s

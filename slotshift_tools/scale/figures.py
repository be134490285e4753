"""The figures of one point, from what the control plane and the generators recorded (pure).

Times are wall-clock seconds: the control plane stamps its decisions with its wall clock and the
generators stamp their events with theirs, one host, one clock.

- decision duration: the control plane's own `duration_ms` (GetDecisions): the policy, the
  reserve rule, validation and the publication of the allocation (re-split and grants);
- decision -> acknowledged: for each decision that published new limits (outcome published) in
  the window, the time from its `decided_at` (stamped as it returns, after the allocation was
  handed to the gateways' mailboxes) to its `enforced_at`: when the control plane had received,
  from every gateway whose part the decision changed, the acknowledgement of its version or of
  a later one (a later one supersedes it: the control plane drops unsent older versions). The
  control plane knows which gateways a version went to; the gateways' side does not (an ack of
  a later re-grant looks the same as one of the decision), so the figure is read from it. A
  decision not enforced by the end is counted apart;
- missed periods: over the window, each gap between consecutive decisions (and between the
  window's ends and the first and last decisions) of g seconds counts floor(g / period - 0.5)
  missed decisions: a gap of about two periods is one decision missed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
    enforced_at_wall_s: float | None = None
    """When every gateway it changed had acknowledged it (GetDecisions' enforced_at); None: not
    (yet), or it published nothing."""


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


def enforced_latencies(
    decisions: Iterable[DecisionTimes], window: Window
) -> tuple[list[float], int]:
    """Seconds from each published decision in the window until every gateway it changed had
    acknowledged it (its `enforced_at`); and how many published decisions of the window were
    not enforced by the last read."""
    latencies: list[float] = []
    unacknowledged = 0
    for decision in decisions:
        if decision.outcome != PUBLISHED or not window.holds(decision.decided_at_wall_s):
            continue
        if decision.enforced_at_wall_s is None:
            unacknowledged += 1
            continue
        latencies.append(max(0.0, decision.enforced_at_wall_s - decision.decided_at_wall_s))
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

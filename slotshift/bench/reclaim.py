"""Reclaim: how long a bursty tenant waits, at the start of each burst, for the slots it is owed.

The issue the slo policy answers: when a bursty tenant wakes up, the slots it lent out come back
only as the borrower's requests end. A burst's reclaim time is measured from the run's
trajectory (the sampler's readings of the gateways): from the burst's start until the first
sample, among those that show the tenant with demand, at which it holds what it is owed, its
nominal share or all it asks for, whichever is less (APF's min(nominal, demand)): it has nothing
queued at the gateways, or it runs at least its nominal share. A tenant that is never short
reclaims within the first sample that sees its burst, so the figure's resolution is the sample
interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slotshift.bench.sampler import Sample
from slotshift.bench.stats import Window, percentile


@dataclass(frozen=True)
class Reclaim:
    """The reclaim times of one tenant's bursts in the steady window."""

    times_s: tuple[float, ...]
    """One per burst that started in the window and was seen with demand before it ended."""
    unresolved: int
    """Bursts in which the tenant never held what it was owed."""

    @property
    def median_s(self) -> float | None:
        return percentile(self.times_s, 50) if self.times_s else None

    @property
    def p90_s(self) -> float | None:
        return percentile(self.times_s, 90) if self.times_s else None


def holds_what_it_is_owed(sample: Sample, tenant: str, nominal_slots: int) -> bool | None:
    """Whether the tenant holds min(nominal, demand) at this sample; None when it has no demand
    (or the sample has no reading of it)."""
    if tenant not in sample.in_flight:
        return None
    in_flight = sample.in_flight[tenant]
    queued = sample.queued.get(tenant, 0)
    if in_flight + queued == 0:
        return None
    return queued == 0 or in_flight >= nominal_slots


def reclaim(
    samples: Sequence[Sample],
    tenant: str,
    nominal_slots: int,
    bursts: Sequence[tuple[float, float]],
    window: Window,
) -> Reclaim:
    """The reclaim time of every burst (start, end) that starts inside the window.

    A burst counts once a sample inside it shows the tenant with demand; its time runs to the
    first such sample at which the tenant holds what it is owed. A burst whose every such
    sample shows it short counts as unresolved (its reclaim outlasted the burst).
    """
    ordered = sorted(samples, key=lambda s: s.t_s)
    times: list[float] = []
    unresolved = 0
    for start_s, end_s in bursts:
        if not window.holds(start_s):
            continue
        inside = [s for s in ordered if start_s <= s.t_s <= min(end_s, window.end_s)]
        readings = [
            (s.t_s, held)
            for s in inside
            if (held := holds_what_it_is_owed(s, tenant, nominal_slots)) is not None
        ]
        if not readings:
            continue
        held_at = next((t_s for t_s, held in readings if held), None)
        if held_at is None:
            unresolved += 1
        else:
            times.append(held_at - start_s)
    return Reclaim(tuple(times), unresolved)

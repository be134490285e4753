"""Reclaim: how long a bursty tenant waits for the slots it is owed when its burst needs them.

The issue the slo policy answers: when a bursty tenant wakes up, the slots it lent out come back
only as the borrower's requests end. Reclaim is measured from the run's trajectory (the
sampler's readings of the gateways). At a sample the tenant is SHORT when it has requests queued
at the gateways while it runs less than its nominal share: it does not hold what it is owed, its
nominal share or all it asks for, whichever is less (APF's min(nominal, demand)). A burst's
reclaim time is the length of its first shortfall: from the first sample in the burst showing
the tenant short to the first later one showing it hold what it is owed. A burst in which the
tenant is never short reclaims in 0 s (it never waited for a slot); one whose first shortfall
outlasts the burst counts as unresolved. The figure's resolution is the sample interval.

At a request's resolution, a burst's start wait (`burst_start_ttft`) is the slowest time to
first token among the tenant's requests sent in the burst's first second: what the first
requests of a burst waited for slots plus the engine's own prefill. Static's is the engine's
part alone, so a policy's figure over static's is what lending cost the lender at a burst's
start, which the 0.25 s samples of the reclaim time cannot resolve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slotshift_tools.bench.sampler import Sample
from slotshift_tools.bench.stats import Window, percentile
from slotshift_tools.bench.trace import RequestTrace

BURST_START_S = 1.0
"""The first part of a burst whose requests' times to first token make its start wait."""


@dataclass(frozen=True)
class Reclaim:
    """The reclaim times of one tenant's bursts in the steady window."""

    times_s: tuple[float, ...]
    """One per burst that started in the window and was resolved in it (0 if never short)."""
    short_bursts: int
    """Bursts in which the tenant was short at least once."""
    unresolved: int
    """Bursts whose first shortfall lasted to the burst's end."""

    @property
    def bursts(self) -> int:
        return len(self.times_s) + self.unresolved

    @property
    def median_s(self) -> float | None:
        return percentile(self.times_s, 50) if self.times_s else None

    @property
    def p90_s(self) -> float | None:
        return percentile(self.times_s, 90) if self.times_s else None


def is_short(sample: Sample, tenant: str, nominal_slots: int) -> bool | None:
    """Whether the tenant queues while it runs less than its nominal share; None when the
    sample has no reading of it."""
    if tenant not in sample.in_flight:
        return None
    return sample.queued.get(tenant, 0) > 0 and sample.in_flight[tenant] < nominal_slots


def reclaim(
    samples: Sequence[Sample],
    tenant: str,
    nominal_slots: int,
    bursts: Sequence[tuple[float, float]],
    window: Window,
) -> Reclaim:
    """The reclaim time of every burst (start, end) that starts inside the window; bursts with
    no reading of the tenant are left out."""
    ordered = sorted(samples, key=lambda s: s.t_s)
    times: list[float] = []
    short_bursts = unresolved = 0
    for start_s, end_s in bursts:
        if not window.holds(start_s):
            continue
        readings = [
            (s.t_s, short)
            for s in ordered
            if start_s <= s.t_s <= min(end_s, window.end_s)
            and (short := is_short(s, tenant, nominal_slots)) is not None
        ]
        if not readings:
            continue
        began = next((t_s for t_s, short in readings if short), None)
        if began is None:
            times.append(0.0)
            continue
        short_bursts += 1
        ended = next((t_s for t_s, short in readings if t_s > began and not short), None)
        if ended is None:
            unresolved += 1
        else:
            times.append(ended - began)
    return Reclaim(tuple(times), short_bursts, unresolved)


def burst_start_ttft_s(
    traces: Sequence[RequestTrace],
    tenant: str,
    bursts: Sequence[tuple[float, float]],
    window: Window,
) -> tuple[float, ...]:
    """The start wait of every burst (start, end) that starts inside the window: the slowest
    time to first token among the tenant's requests sent in [start, start + BURST_START_S)
    (within the burst), of those that got one. Bursts without such a request are left out."""
    waits = []
    for start_s, end_s in bursts:
        if not window.holds(start_s):
            continue
        until_s = min(start_s + BURST_START_S, end_s)
        ttfts = [
            trace.first_token_s - trace.start_s
            for trace in traces
            if trace.tenant == tenant
            and trace.first_token_s is not None
            and start_s <= trace.start_s < until_s
        ]
        if ttfts:
            waits.append(max(ttfts))
    return tuple(waits)

"""Reserves learned from a tenant's own bursts (the slo policy's `learned_reserves`).

A lent slot comes back from a non-preemptible borrower only when the request in it ends; what a
bursting tenant needs at once is what it asks for in the first moments of a burst. So each burst
(the tenant's demand, in flight plus queued, rising from idle) records its peak demand over its
first `reserve_burst_window_s`, and the reserve is a high percentile of those peaks, each burst
weighted by 0.5 ** (age / `reserve_history_half_life_s`). Pure: the history is a value carried in
the policy's state, and time is the snapshots' `now_s`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from slotshift.config import SloPolicyConfig

MAX_BURSTS = 64
"""Most bursts one tenant's history keeps (the newest): the state stays small whatever the load,
and 64 samples are plenty for a 95th or 99th percentile."""

FORGET_AFTER_HALF_LIVES = 10.0
"""A burst older than this many half-lives weighs under 0.1% of a new one: dropped."""


@dataclass(frozen=True, slots=True)
class Burst:
    """One recorded burst: its peak demand in its first window, and when it started."""

    peak_slots: int
    started_s: float


@dataclass(frozen=True, slots=True)
class BurstHistory:
    """What one tenant's learned reserve is made from."""

    bursts: tuple[Burst, ...] = ()
    """Recorded bursts, oldest first."""
    open_started_s: float | None = None
    """When the burst now in its first window started; None when there is none."""
    open_peak_slots: int = 0
    """The highest demand seen so far in the open burst's window."""
    idle: bool = False
    """Whether the tenant was idle at the last snapshot (a burst starts only from idle). False
    before the first snapshot: demand seen first is not known to be a burst's start."""


def observe(
    history: BurstHistory | None, demand_slots: int, now_s: float, settings: SloPolicyConfig
) -> BurstHistory:
    """The history after a snapshot at `now_s` in which the tenant's demand is `demand_slots`.

    An open burst whose window has ended by `now_s` is recorded first (this snapshot's demand is
    outside it); then a burst opens if the tenant was idle and is not now, or the open one takes
    this demand into its peak. Bursts older than FORGET_AFTER_HALF_LIVES half-lives, and all but
    the newest MAX_BURSTS, are dropped.
    """
    previous = history if history is not None else BurstHistory()
    bursts = previous.bursts
    open_started = previous.open_started_s
    open_peak = previous.open_peak_slots
    if open_started is not None and now_s - open_started > settings.reserve_burst_window_s:
        bursts = (*bursts, Burst(open_peak, open_started))
        open_started, open_peak = None, 0
    idle = demand_slots <= settings.reserve_idle_demand_slots
    if open_started is not None:
        open_peak = max(open_peak, demand_slots)
    elif previous.idle and not idle:
        open_started, open_peak = now_s, demand_slots
    horizon = settings.reserve_history_half_life_s * FORGET_AFTER_HALF_LIVES
    bursts = tuple(b for b in bursts if now_s - b.started_s <= horizon)[-MAX_BURSTS:]
    return BurstHistory(bursts, open_started, open_peak, idle)


def learned_reserve(
    history: BurstHistory | None,
    now_s: float,
    settings: SloPolicyConfig,
    *,
    floor_slots: int,
    nominal_slots: int,
    configured_slots: int,
) -> int:
    """The tenant's reserve: the weighted `reserve_percentile` of its recorded bursts' peaks, or
    `configured_slots` (its lendable_percent reserve) while it has none; in either case at least
    `floor_slots` and at most the bound, max(floor, round(nominal x reserve_max_percent / 100)),
    itself at most `nominal_slots`.

    The weighted percentile is the smallest recorded peak such that the bursts at or below it
    carry at least reserve_percentile % of the total weight.
    """
    bound = min(
        nominal_slots,
        max(floor_slots, round(nominal_slots * settings.reserve_max_percent / 100)),
    )
    bursts = history.bursts if history is not None else ()
    if not bursts:
        value = configured_slots
    else:
        value = _weighted_percentile(
            bursts, now_s, settings.reserve_history_half_life_s, settings.reserve_percentile
        )
    return min(bound, max(floor_slots, value))


def _weighted_percentile(
    bursts: tuple[Burst, ...], now_s: float, half_life_s: float, percentile: float
) -> int:
    weighted = sorted(
        (b.peak_slots, math.pow(0.5, max(0.0, now_s - b.started_s) / half_life_s)) for b in bursts
    )
    total = sum(weight for _, weight in weighted)
    wanted = total * percentile / 100
    covered = 0.0
    for peak, weight in weighted:
        covered += weight
        # A relative tolerance: 100% must reach the largest peak despite rounding in the sum.
        if covered >= wanted * (1 - 1e-12):
            return peak
    return weighted[-1][0]


def changed(before: Mapping[str, int] | None, after: Mapping[str, int]) -> dict[str, int]:
    """The reserves in `after` that differ from `before` (all of them when there is no before)."""
    if before is None:
        return dict(after)
    return {name: value for name, value in after.items() if before.get(name) != value}

"""The slo policy: lend idle slots like the demand policy, but give them back at once, keep a
reserve that is never lent, and favour tenants whose latency is over their SLO.

It follows Kubernetes API Priority and Fairness's borrowing (KEP-1040) where that fits:
- each tenant has a nominal share (by weight); `lendable_percent` of it may be lent, the rest is
  a reserve (APF's MinCL; Kueue's lendingLimit seen from the lender's side), or the reserve is
  learned from the tenant's own bursts (`learned_reserves`, controlplane/core/learned_reserves.py);
  a reserve is lent only to preemptible tenants, whose borrowed work is paused as soon as the
  lender needs it back (the reserve rule, controlplane/core/reserves.py); a tenant whose p99 is
  over its SLO keeps its reserve times its SLO pressure (below), up to its nominal share, so
  that a reserve too small for its bursts grows while they wait and shrinks back once within;
- `borrowing_limit_percent` caps what it may hold above its nominal share (APF's MaxCL);
- a tenant's demand is smoothed so that it rises at once and decays with a half-life;
- a tenant that asks for no more than its nominal share gets what it asks at once (APF's
  MinCurrentCL = max(MinCL, min(Nominal, demand))): lent slots are reclaimed at the next decision,
  and the gateways stop admitting the borrower's new requests at once;
- the rest is divided by one fair proportion over weight x smoothed demand x SLO pressure.

The study's reward (throughput, minus a penalty for tail latency over the SLO, minus cost) shapes
the rule: slots go where there is demand (throughput); a tenant whose p99 TTFT or end-to-end
latency is over its SLO has its claim multiplied by 1 + slo_boost x overshoot (penalty); and while
the engine is saturated (KV cache at or above kv_saturation_perc, or at least
waiting_saturation_percent of the budget waiting inside the engine, more than the few that wait
for the next step) no tenant's borrowing grows, since more concurrency would only add queueing
(cost). The reward's terms are computed for every decision and stated in its reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from controlplane.core import learned_reserves
from controlplane.core.columns import Counts, Flags, Floats, PoolColumns, pool_columns
from controlplane.core.learned_reserves import BurstHistory
from controlplane.core.policy import PolicyDecision
from controlplane.core.reserves import excess_of, hold_reserves_column
from controlplane.core.snapshot import PoolSnapshot, TenantLoad
from slotshift.apportion import apportion_arrays, nominal_shares
from slotshift.config import PoolConfig, SloPolicyConfig


@dataclass(frozen=True, slots=True)
class SloPolicyState:
    """What the slo policy remembers between decisions."""

    smoothed_demand: Mapping[str, float]
    now_s: float
    bursts: Mapping[str, BurstHistory] = field(default_factory=dict)
    """Per tenant, the bursts its learned reserve is made from (empty unless learned_reserves)."""
    reserves: Mapping[str, int] | None = None
    """The learned reserves this decision held (reserves.HoldsReserves); None when reserves are
    not learned, and the configured ones apply."""


class SloPolicy:
    """See the module docstring. Pure: a function of (snapshot, pool, previous state).

    Contract (besides AllocationPolicy's): every tenant holds at least
    max(floor, min(nominal, demand)) and at most min(ceiling, nominal + borrowing limit), where
    demand is what it runs plus what waits; those lower bounds never sum above the budget because
    each is at most the tenant's nominal share. The limits obey the reserve rule
    (controlplane/core/reserves.py) for the reserves the decision's state names; with no
    preemptible tenant that means every tenant also holds at least its reserve.

    Every per-tenant pass is one numpy operation over the pool's tenants
    (controlplane/core/columns.py); the per-tenant form of this policy is kept as the reference
    it must equal in limits, reason and state (tests/unit/controlplane/reference_policy.py).
    """

    name = "slo"
    needs_advice = False

    def decide(
        self, snapshot: PoolSnapshot, pool: PoolConfig, state: object | None
    ) -> PolicyDecision:
        settings = pool.slo_policy
        previous = state if isinstance(state, SloPolicyState) else None
        columns = pool_columns(pool)
        nominal = columns.nominal
        load = _Loads.of(snapshot.tenants, columns.names)
        bursts, learned = _learn_reserves(pool, columns, load, previous, snapshot.now_s)
        base_reserve = columns.configured_reserve if learned is None else columns.column(learned)
        pressure = _slo_pressure(columns, load, settings.slo_boost)
        reserve = np.minimum(
            _grown_reserve(base_reserve, nominal, pressure), columns.borrowing_upper
        )
        bound_upper = np.maximum(columns.borrowing_upper, nominal)
        smoothed = _smooth(load.demand, columns.names, previous, snapshot.now_s, settings)
        next_state = SloPolicyState(
            smoothed_demand=dict(zip(columns.names, smoothed.tolist(), strict=True)),
            now_s=snapshot.now_s,
            bursts=bursts,
            reserves=learned,
        )
        new_reserves = (
            learned_reserves.changed(previous.reserves if previous else None, learned)
            if learned is not None
            else {}
        )
        if not smoothed.any():
            reason = _with_reserves("no demand: nominal shares", new_reserves)
            return PolicyDecision(nominal_shares(pool), reason, next_state)

        preemptible = columns.preemptible
        owed = _owed(columns, reserve, load.demand)
        saturated = _saturated(snapshot, settings, pool.budget_slots)
        current = columns.column(snapshot.current_limits, default=nominal)
        # Borrowing grows by at most one step a decision, and not at all while the engine is
        # saturated; what it already holds it keeps.
        step = 0 if saturated else settings.max_borrow_step_slots
        upper = np.minimum(bound_upper, np.maximum(np.maximum(nominal, current + step), owed))
        if int(upper.sum()) < pool.budget_slots:
            # Holding every borrower to its step would leave slots unassigned; the budget is
            # always handed out in full, so the step gives way.
            upper = bound_upper
        at_full_share = _at_full_share(columns, load.demand, settings)
        if at_full_share.any():
            # A lender that uses its whole share gets the engine as fast as the static split
            # gives it: every request more in the batch makes each of its tokens slower, so
            # while it runs nobody else holds more than its own share.
            upper = np.where(at_full_share, upper, np.minimum(upper, np.maximum(nominal, owed)))
        target = smoothed * columns.weight * pressure
        limits = apportion_arrays(pool.budget_slots, owed, upper, target)
        if preemptible.any():
            limits = _lend_reserves_to_preemptible(
                columns, limits, owed, upper, target, pool.budget_slots, reserve
            )
        if _within_hysteresis(
            columns, limits, snapshot.current_limits, owed, upper, settings, pool, reserve
        ):
            published = dict(snapshot.current_limits)
            limits = columns.column(published)
        else:
            published = columns.mapping(limits)
        reason = _reason(columns, load.demand, limits, owed, pressure, saturated, reserve)
        return PolicyDecision(published, _with_reserves(reason, new_reserves), next_state)


@dataclass(frozen=True, slots=True)
class _Loads:
    """What the policy reads of each tenant's load, as arrays in the pool's order."""

    demand: Counts
    ttft_count: Counts
    ttft_p99_ms: Floats
    e2e_count: Counts
    e2e_p99_ms: Floats
    by_name: Mapping[str, TenantLoad]
    """Every pool tenant's load (TenantLoad() for one the snapshot does not name)."""

    @classmethod
    def of(cls, tenants: Mapping[str, TenantLoad], names: tuple[str, ...]) -> _Loads:
        empty = TenantLoad()
        get = tenants.get
        loads = [get(name, empty) for name in names]
        count = len(loads)
        return cls(
            demand=np.fromiter(
                (load.in_flight + load.queued for load in loads), dtype=np.int64, count=count
            ),
            ttft_count=np.fromiter((load.ttft.count for load in loads), np.int64, count),
            ttft_p99_ms=np.fromiter((load.ttft.p99_ms for load in loads), np.float64, count),
            e2e_count=np.fromiter((load.e2e.count for load in loads), np.int64, count),
            e2e_p99_ms=np.fromiter((load.e2e.p99_ms for load in loads), np.float64, count),
            by_name=dict(zip(names, loads, strict=True)),
        )


def _learn_reserves(
    pool: PoolConfig,
    columns: PoolColumns,
    load: _Loads,
    previous: SloPolicyState | None,
    now_s: float,
) -> tuple[dict[str, BurstHistory], dict[str, int] | None]:
    """Each tenant's burst history after this snapshot, and its learned reserve; ({}, None) when
    reserves are not learned."""
    settings = pool.slo_policy
    if not settings.learned_reserves:
        return {}, None
    bursts: dict[str, BurstHistory] = {}
    reserves: dict[str, int] = {}
    demand = load.demand.tolist()
    nominal = columns.nominal.tolist()
    configured = columns.configured_reserve.tolist()
    for index, tenant in enumerate(pool.tenants):
        name = tenant.name
        before = previous.bursts.get(name) if previous is not None else None
        history = learned_reserves.observe(before, demand[index], now_s, settings)
        bursts[name] = history
        reserves[name] = learned_reserves.learned_reserve(
            history,
            now_s,
            settings,
            floor_slots=tenant.floor_slots,
            nominal_slots=nominal[index],
            configured_slots=configured[index],
        )
    return bursts, reserves


def _grown_reserve(reserve: Counts, nominal: Counts, pressure: Floats) -> Counts:
    """Each tenant's reserve times its SLO pressure, rounded up, up to its nominal share (never
    below the reserve): a tenant over its SLO while holding its reserve is still waiting for
    slots, so the headroom its bursts find free grows with how far over it is, and shrinks back
    once it is within its SLO."""
    grown = np.minimum(np.ceil(reserve * pressure).astype(np.int64), nominal)
    result: Counts = np.maximum(reserve, grown)
    return result


def _owed(columns: PoolColumns, reserve: Counts, demand: Counts) -> Counts:
    """What each tenant gets at once: what it asks up to its nominal share, and its reserve while
    it asks anything. An idle tenant's reserve may go to a preemptible tenant (whose borrowed work
    is paused as soon as the tenant asks, so lending it is safe; the reserve rule keeps other
    borrowers off it); from a burst's first request on, the reserve is the burst's headroom, so
    that the requests that follow are admitted at once instead of a round trip each."""
    asked = np.maximum(columns.floor, np.minimum(columns.nominal, demand))
    preemptible = columns.preemptible
    others_preemptible = int(preemptible.sum()) - preemptible.astype(np.int64) > 0
    owed: Counts = np.where(others_preemptible & (demand == 0), asked, np.maximum(reserve, asked))
    return owed


def _at_full_share(columns: PoolColumns, demand: Counts, settings: SloPolicyConfig) -> Flags:
    """Tenants that are not preemptible and ask at least full_share_hold_percent of their
    nominal share now, and no more than it (none when the setting is off). A tenant that asks
    more than its share wants slots before speed, and gets what the claims give it."""
    percent = settings.full_share_hold_percent
    nominal = columns.nominal
    if percent is None:
        return np.zeros(columns.size, dtype=np.bool_)
    held: Flags = (
        ~columns.preemptible
        & (nominal > 0)
        & (percent * nominal <= demand * 100)
        & (demand <= nominal)
    )
    return held


def _lend_reserves_to_preemptible(
    columns: PoolColumns,
    limits: Counts,
    lower: Counts,
    upper: Counts,
    target: Floats,
    budget_slots: int,
    reserve: Counts,
) -> Counts:
    """`limits` made to obey the reserve rule, the slots that non-preemptible borrowers give back
    divided again among the other tenants (so that they go to a preemptible borrower with demand
    rather than sit idle in a lender's reserve), the rule applied once more."""
    held = hold_reserves_column(columns, limits, reserve)
    if np.array_equal(held, limits):
        return limits
    gave_back = held < limits
    shared = apportion_arrays(
        budget_slots,
        np.where(gave_back, held, lower),
        np.where(gave_back, held, upper),
        np.where(gave_back, 0.0, target),
    )
    return hold_reserves_column(columns, shared, reserve)


def _smooth(
    demand: Counts,
    names: tuple[str, ...],
    previous: SloPolicyState | None,
    now_s: float,
    settings: SloPolicyConfig,
) -> Floats:
    """Demand that rises at once and decays with the half-life (APF's Smooth, in seconds)."""
    now = demand.astype(np.float64)
    if previous is None:
        return now
    elapsed = max(0.0, now_s - previous.now_s)
    keep = math.pow(0.5, elapsed / settings.demand_half_life_s)
    get = previous.smoothed_demand.get
    before = np.array([get(name, 0.0) for name in names], dtype=np.float64)
    decayed = keep * before + (1 - keep) * now
    # Below one slot the memory is noise; dropping it lets an idle tenant's slots go.
    smoothed: Floats = np.maximum(now, np.where(decayed >= 0.5, decayed, 0.0))
    return smoothed


def _slo_pressure(columns: PoolColumns, load: _Loads, boost: float) -> Floats:
    """1 when within its SLOs (or none is set); more the further its p99 is over them."""
    overshoot = np.maximum(
        _overshoot(load.ttft_p99_ms, load.ttft_count, columns.ttft_slo_ms),
        _overshoot(load.e2e_p99_ms, load.e2e_count, columns.e2e_slo_ms),
    )
    pressure: Floats = 1.0 + boost * overshoot
    return pressure


def _overshoot(p99_ms: Floats, count: Counts, slo_ms: Floats) -> Floats:
    """max(0, p99 / slo - 1), 0 where there is no SLO (NaN) or no sample."""
    with np.errstate(divide="ignore", invalid="ignore"):
        over = np.maximum(0.0, p99_ms / slo_ms - 1.0)
    result: Floats = np.where(np.isnan(slo_ms) | (count == 0), 0.0, over)
    return result


def _saturated(snapshot: PoolSnapshot, settings: SloPolicyConfig, budget_slots: int) -> bool:
    telemetry = snapshot.telemetry
    if telemetry is None or not telemetry.fresh:
        return False
    waiting_limit = max(1.0, budget_slots * settings.waiting_saturation_percent / 100)
    return (
        telemetry.kv_cache_usage_perc >= settings.kv_saturation_perc
        or telemetry.num_requests_waiting >= waiting_limit
    )


def _within_hysteresis(
    columns: PoolColumns,
    limits: Counts,
    current: Mapping[str, int],
    owed: Counts,
    upper: Counts,
    settings: SloPolicyConfig,
    pool: PoolConfig,
    reserve: Counts,
) -> bool:
    """Whether the current limits are close enough to keep: valid, owing nobody, holding the
    reserves, all near."""
    if current.keys() != columns.name_set or sum(current.values()) != pool.budget_slots:
        return False
    held = columns.column(current)
    if not ((owed <= held) & (held <= upper)).all():
        return False
    if excess_of(columns, held, reserve) > 0:
        return False
    return bool((np.abs(limits - held) <= settings.hysteresis_slots).all())


def _reason(
    columns: PoolColumns,
    demand: Counts,
    limits: Counts,
    owed: Counts,
    pressure: Floats,
    saturated: bool,
    reserve: Counts,
) -> str:
    """The reward's terms in words: served demand, SLO overshoot, saturation; and the reserve
    slots lent to preemptible tenants, if any."""
    served = int(np.minimum(limits, demand).sum())
    names = columns.names
    over = [f"{names[i]} x{pressure[i]:.2f}" for i in np.flatnonzero(pressure > 1.0).tolist()]
    parts = [
        f"serves {served} of {int(demand.sum())} slots of demand",
        f"owed {columns.mapping(owed)}",
        f"over SLO: {', '.join(over)}" if over else "all within SLO",
    ]
    if saturated:
        parts.append("engine saturated: borrowing held")
    lent = int(np.maximum(0, reserve - limits).sum())
    if lent:
        parts.append(f"{lent} reserve slots lent to preemptible tenants")
    return "; ".join(parts)


def _with_reserves(reason: str, new_reserves: Mapping[str, int]) -> str:
    """The reason, with the learned reserves that changed in this decision (only those)."""
    if not new_reserves:
        return reason
    described = ", ".join(f"{name}={value}" for name, value in new_reserves.items())
    return f"{reason}; learned reserves {described}"

"""The slo policy: lend idle slots like the demand policy, but give them back at once, keep a
reserve that is never lent, and favour tenants whose latency is over their SLO.

It follows Kubernetes API Priority and Fairness's borrowing (KEP-1040) where that fits:
- each tenant has a nominal share (by weight); `lendable_percent` of it may be lent, the rest is
  a reserve (APF's MinCL; Kueue's lendingLimit seen from the lender's side), or the reserve is
  learned from the tenant's own bursts (`learned_reserves`, controlplane/core/learned_reserves.py);
  a reserve is lent only to preemptible tenants, whose borrowed work is paused as soon as the
  lender needs it back (the reserve rule, controlplane/core/reserves.py);
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.core import learned_reserves
from controlplane.core.learned_reserves import BurstHistory
from controlplane.core.policy import PolicyDecision
from controlplane.core.reserves import (
    configured_reserve,
    hold_reserves,
    preemptible_tenants,
    reserve_excess,
)
from controlplane.core.snapshot import PoolSnapshot, TenantLoad
from slotshift.apportion import Claim, apportion, nominal_shares
from slotshift.config import PoolConfig, SloPolicyConfig, TenantConfig
from slotshift.demand import LatencySummary


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


@dataclass(frozen=True, slots=True)
class _Bounds:
    nominal: int
    reserve: int
    upper: int


class SloPolicy:
    """See the module docstring. Pure: a function of (snapshot, pool, previous state).

    Contract (besides AllocationPolicy's): every tenant holds at least
    max(floor, min(nominal, demand)) and at most min(ceiling, nominal + borrowing limit), where
    demand is what it runs plus what waits; those lower bounds never sum above the budget because
    each is at most the tenant's nominal share. The limits obey the reserve rule
    (controlplane/core/reserves.py) for the reserves the decision's state names; with no
    preemptible tenant that means every tenant also holds at least its reserve.
    """

    name = "slo"
    needs_advice = False

    def decide(
        self, snapshot: PoolSnapshot, pool: PoolConfig, state: object | None
    ) -> PolicyDecision:
        settings = pool.slo_policy
        previous = state if isinstance(state, SloPolicyState) else None
        nominal = nominal_shares(pool)
        loads = {t.name: snapshot.tenants.get(t.name, TenantLoad()) for t in pool.tenants}
        bursts, learned = _learn_reserves(pool, loads, previous, snapshot.now_s, nominal)
        bounds = {t.name: _bounds(pool, t, nominal[t.name], learned) for t in pool.tenants}
        reserves = {name: b.reserve for name, b in bounds.items()}
        smoothed = _smooth(loads, previous, snapshot.now_s, settings.demand_half_life_s)
        next_state = SloPolicyState(
            smoothed_demand=smoothed, now_s=snapshot.now_s, bursts=bursts, reserves=learned
        )
        new_reserves = (
            learned_reserves.changed(previous.reserves if previous else None, learned)
            if learned is not None
            else {}
        )
        if not any(smoothed.values()):
            reason = _with_reserves("no demand: nominal shares", new_reserves)
            return PolicyDecision(nominal, reason, next_state)

        preemptible = preemptible_tenants(pool)
        owed = {
            t.name: _owed(t, nominal[t.name], bounds[t.name], loads[t.name], preemptible)
            for t in pool.tenants
        }
        pressure = {
            t.name: _slo_pressure(t, loads[t.name], settings.slo_boost) for t in pool.tenants
        }
        saturated = _saturated(snapshot, settings, pool.budget_slots)
        upper = {}
        for tenant in pool.tenants:
            name = tenant.name
            current = snapshot.current_limits.get(name, nominal[name])
            # Borrowing grows by at most one step a decision, and not at all while the engine is
            # saturated; what it already holds it keeps.
            step = 0 if saturated else settings.max_borrow_step_slots
            upper[name] = min(bounds[name].upper, max(nominal[name], current + step, owed[name]))
        if sum(upper.values()) < pool.budget_slots:
            # Holding every borrower to its step would leave slots unassigned; the budget is
            # always handed out in full, so the step gives way.
            upper = {t.name: bounds[t.name].upper for t in pool.tenants}
        at_full_share = _at_full_share(pool, loads, nominal, preemptible, settings)
        if at_full_share:
            # A lender that uses its whole share gets the engine as fast as the static split
            # gives it: every request more in the batch makes each of its tokens slower, so
            # while it runs nobody else holds more than its own share.
            upper = {
                name: value if name in at_full_share else min(value, max(nominal[name], owed[name]))
                for name, value in upper.items()
            }
        claims = [
            Claim(owed[t.name], upper[t.name], smoothed[t.name] * t.weight * pressure[t.name])
            for t in pool.tenants
        ]
        limits = dict(
            zip((t.name for t in pool.tenants), apportion(pool.budget_slots, claims), strict=True)
        )
        if preemptible:
            limits = _lend_reserves_to_preemptible(limits, claims, pool, reserves)
        current_limits = dict(snapshot.current_limits)
        if _within_hysteresis(
            limits, current_limits, owed, upper, settings.hysteresis_slots, pool, reserves
        ):
            limits = current_limits
        reason = _reason(loads, limits, owed, pressure, saturated, pool, reserves)
        return PolicyDecision(limits, _with_reserves(reason, new_reserves), next_state)


def _learn_reserves(
    pool: PoolConfig,
    loads: Mapping[str, TenantLoad],
    previous: SloPolicyState | None,
    now_s: float,
    nominal: Mapping[str, int],
) -> tuple[dict[str, BurstHistory], dict[str, int] | None]:
    """Each tenant's burst history after this snapshot, and its learned reserve; ({}, None) when
    reserves are not learned."""
    settings = pool.slo_policy
    if not settings.learned_reserves:
        return {}, None
    bursts: dict[str, BurstHistory] = {}
    reserves: dict[str, int] = {}
    for tenant in pool.tenants:
        name = tenant.name
        before = previous.bursts.get(name) if previous is not None else None
        history = learned_reserves.observe(before, loads[name].demand_slots, now_s, settings)
        bursts[name] = history
        reserves[name] = learned_reserves.learned_reserve(
            history,
            now_s,
            settings,
            floor_slots=tenant.floor_slots,
            nominal_slots=nominal[name],
            configured_slots=configured_reserve(tenant, nominal[name]),
        )
    return bursts, reserves


def _owed(
    tenant: TenantConfig,
    nominal: int,
    bounds: _Bounds,
    load: TenantLoad,
    preemptible: frozenset[str],
) -> int:
    """What the tenant gets at once: what it asks up to its nominal share, and its reserve while
    it asks anything. An idle tenant's reserve may go to a preemptible tenant (whose borrowed work
    is paused as soon as the tenant asks, so lending it is safe; the reserve rule keeps other
    borrowers off it); from a burst's first request on, the reserve is the burst's headroom, so
    that the requests that follow are admitted at once instead of a round trip each."""
    asked = max(tenant.floor_slots, min(nominal, load.demand_slots))
    if preemptible - {tenant.name} and load.demand_slots == 0:
        return asked
    return max(bounds.reserve, asked)


def _at_full_share(
    pool: PoolConfig,
    loads: Mapping[str, TenantLoad],
    nominal: Mapping[str, int],
    preemptible: frozenset[str],
    settings: SloPolicyConfig,
) -> frozenset[str]:
    """Tenants that are not preemptible and ask at least full_share_hold_percent of their
    nominal share now, and no more than it (none when the setting is off). A tenant that asks
    more than its share wants slots before speed, and gets what the claims give it."""
    percent = settings.full_share_hold_percent
    if percent is None:
        return frozenset()
    return frozenset(
        t.name
        for t in pool.tenants
        if t.name not in preemptible
        and nominal[t.name] > 0
        and percent * nominal[t.name] <= loads[t.name].demand_slots * 100
        and loads[t.name].demand_slots <= nominal[t.name]
    )


def _lend_reserves_to_preemptible(
    limits: dict[str, int],
    claims: Sequence[Claim],
    pool: PoolConfig,
    reserves: Mapping[str, int],
) -> dict[str, int]:
    """`limits` made to obey the reserve rule, the slots that non-preemptible borrowers give back
    divided again among the other tenants (so that they go to a preemptible borrower with demand
    rather than sit idle in a lender's reserve), the rule applied once more."""
    held = hold_reserves(limits, pool, reserves)
    if held == limits:
        return limits
    names = [t.name for t in pool.tenants]
    again = [
        Claim(held[name], held[name], 0.0) if held[name] < limits[name] else claim
        for name, claim in zip(names, claims, strict=True)
    ]
    shared = dict(zip(names, apportion(pool.budget_slots, again), strict=True))
    return hold_reserves(shared, pool, reserves)


def _bounds(
    pool: PoolConfig, tenant: TenantConfig, nominal: int, learned: Mapping[str, int] | None
) -> _Bounds:
    reserve = configured_reserve(tenant, nominal) if learned is None else learned[tenant.name]
    ceiling = pool.ceiling_of(tenant)
    if tenant.borrowing_limit_percent is None:
        upper = ceiling
    else:
        upper = min(ceiling, nominal + round(nominal * tenant.borrowing_limit_percent / 100))
    return _Bounds(nominal=nominal, reserve=min(reserve, upper), upper=max(upper, nominal))


def _smooth(
    loads: Mapping[str, TenantLoad],
    previous: SloPolicyState | None,
    now_s: float,
    half_life_s: float,
) -> dict[str, float]:
    """Demand that rises at once and decays with the half-life (APF's Smooth, in seconds)."""
    if previous is None:
        return {name: float(load.demand_slots) for name, load in loads.items()}
    elapsed = max(0.0, now_s - previous.now_s)
    keep = math.pow(0.5, elapsed / half_life_s)
    smoothed = {}
    for name, load in loads.items():
        before = previous.smoothed_demand.get(name, 0.0)
        now = float(load.demand_slots)
        decayed = keep * before + (1 - keep) * now
        # Below one slot the memory is noise; dropping it lets an idle tenant's slots go.
        smoothed[name] = max(now, decayed if decayed >= 0.5 else 0.0)
    return smoothed


def _slo_pressure(tenant: TenantConfig, load: TenantLoad, boost: float) -> float:
    """1 when within its SLOs (or none is set); more the further its p99 is over them."""
    overshoot = max(
        _overshoot(load.ttft, tenant.ttft_slo_ms), _overshoot(load.e2e, tenant.e2e_slo_ms)
    )
    return 1.0 + boost * overshoot


def _overshoot(latency: LatencySummary, slo_ms: float | None) -> float:
    if slo_ms is None or latency.count == 0:
        return 0.0
    return max(0.0, latency.p99_ms / slo_ms - 1.0)


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
    limits: Mapping[str, int],
    current: Mapping[str, int],
    owed: Mapping[str, int],
    upper: Mapping[str, int],
    hysteresis_slots: int,
    pool: PoolConfig,
    reserves: Mapping[str, int],
) -> bool:
    """Whether the current limits are close enough to keep: valid, owing nobody, holding the
    reserves, all near."""
    if set(current) != set(limits) or sum(current.values()) != pool.budget_slots:
        return False
    if any(not owed[name] <= current[name] <= upper[name] for name in limits):
        return False
    if reserve_excess(current, pool, reserves) > 0:
        return False
    return all(abs(limits[name] - current[name]) <= hysteresis_slots for name in limits)


def _reason(
    loads: Mapping[str, TenantLoad],
    limits: Mapping[str, int],
    owed: Mapping[str, int],
    pressure: Mapping[str, float],
    saturated: bool,
    pool: PoolConfig,
    reserves: Mapping[str, int],
) -> str:
    """The reward's terms in words: served demand, SLO overshoot, saturation; and the reserve
    slots lent to preemptible tenants, if any."""
    served = sum(min(limits[n], load.demand_slots) for n, load in loads.items())
    demand = sum(load.demand_slots for load in loads.values())
    over = [f"{n} x{p:.2f}" for n, p in pressure.items() if p > 1.0]
    parts = [
        f"serves {served} of {demand} slots of demand",
        f"owed {dict(owed)}",
        f"over SLO: {', '.join(over)}" if over else "all within SLO",
    ]
    if saturated:
        parts.append("engine saturated: borrowing held")
    lent = sum(max(0, reserves[name] - limits[name]) for name in limits)
    if lent:
        parts.append(f"{lent} reserve slots lent to preemptible tenants")
    return "; ".join(parts)


def _with_reserves(reason: str, new_reserves: Mapping[str, int]) -> str:
    """The reason, with the learned reserves that changed in this decision (only those)."""
    if not new_reserves:
        return reason
    described = ", ".join(f"{name}={value}" for name, value in new_reserves.items())
    return f"{reason}; learned reserves {described}"

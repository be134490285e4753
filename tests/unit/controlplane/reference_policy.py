"""The per-tenant implementations the vectorised ones must equal, kept as references.

`controlplane/core/slo_policy.py`, `reserves.py` and `validation.py` were per-tenant Python until
a decision at 10,000 tenants cost over 100 ms; they are numpy now. This module holds their last
per-tenant form, unchanged but for names (`ReferenceSloPolicy`), so that
test_vectorised_decisions.py can check that the fast ones return exactly the same limits, reasons,
states and errors. Only tests import it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controlplane.core import learned_reserves
from controlplane.core.learned_reserves import BurstHistory
from controlplane.core.policy import PolicyDecision
from controlplane.core.reserves import HoldsReserves, configured_reserve, describe_moves
from controlplane.core.slo_policy import SloPolicyState
from controlplane.core.snapshot import PoolSnapshot, TenantLoad
from controlplane.core.validation import InvalidAllocation
from slotshift.apportion import Claim, apportion, nominal_shares
from slotshift.config import PoolConfig, SloPolicyConfig, TenantConfig
from slotshift.demand import LatencySummary


@dataclass(frozen=True, slots=True)
class _Bounds:
    nominal: int
    reserve: int
    upper: int


def holding_reserves(decision: PolicyDecision, pool: PoolConfig) -> PolicyDecision:
    """publishable.holding_reserves over the references below."""
    validate_limits(decision.limits, pool)
    reserves = reserves_in_force(pool, decision.state)
    held = hold_reserves(decision.limits, pool, reserves)
    validate_limits(held, pool, reserves=reserves)
    if held == dict(decision.limits):
        return decision
    reason = f"{decision.reason}; reserves held: {describe_moves(decision.limits, held)}"
    return dataclasses.replace(decision, limits=held, reason=reason)


def configured_reserves(pool: PoolConfig) -> dict[str, int]:
    """Every tenant's `configured_reserve`, against its nominal share."""
    nominal = nominal_shares(pool)
    return {t.name: configured_reserve(t, nominal[t.name]) for t in pool.tenants}


def reserves_in_force(pool: PoolConfig, policy_state: object | None) -> dict[str, int]:
    """The reserves a decision must hold: those the policy state names (HoldsReserves), else the
    configured ones; a tenant the state does not name gets its configured reserve, and each is
    clamped to [floor, nominal share] (a reserve above the nominal share could not be held)."""
    configured = configured_reserves(pool)
    named = policy_state.reserves if isinstance(policy_state, HoldsReserves) else None
    if not named:
        return configured
    nominal = nominal_shares(pool)
    return {
        t.name: min(nominal[t.name], max(t.floor_slots, named.get(t.name, configured[t.name])))
        for t in pool.tenants
    }


def preemptible_tenants(pool: PoolConfig) -> frozenset[str]:
    """Tenants whose borrowed work is paused when a lender needs its slots back: those that opted
    in (`preemptible`), while the pool's preemption is enabled (otherwise nobody is)."""
    if not pool.preemption.enabled:
        return frozenset()
    return frozenset(t.name for t in pool.tenants if t.preemptible)


def reserve_excess(limits: Mapping[str, int], pool: PoolConfig, reserves: Mapping[str, int]) -> int:
    """How many slots of the lenders' reserves non-preemptible tenants hold: the left side of the
    reserve rule less its right side. The rule holds when this is at most 0.

    `limits` must name every tenant of the pool; `reserves` may omit tenants (reserve 0).
    """
    nominal = nominal_shares(pool)
    preemptible = preemptible_tenants(pool)
    lent_from_reserves = sum(
        max(0, min(reserves.get(t.name, 0), nominal[t.name]) - limits[t.name]) for t in pool.tenants
    )
    borrowed_by_preemptible = sum(
        max(0, limits[name] - nominal[name]) for name in preemptible if name in limits
    )
    return lent_from_reserves - borrowed_by_preemptible


def hold_reserves(
    limits: Mapping[str, int], pool: PoolConfig, reserves: Mapping[str, int]
) -> dict[str, int]:
    """`limits` changed as little as needed to obey the reserve rule.

    Precondition: `limits` is valid for `pool` (validation.validate_limits: every tenant named,
    each within its floor and ceiling, summing to the budget).

    Contract:
    - the result sums to what `limits` sums to, and each value stays within the tenant's floor
      and ceiling;
    - the result obeys the reserve rule (`reserve_excess(result, ...) <= 0`);
    - when `limits` already obeys it, the result equals `limits` (so the function is
      idempotent);
    - otherwise exactly `reserve_excess` slots move, one at a time, from the non-preemptible
      tenant that holds the most above its nominal share (never below that share) to the tenant
      furthest below its reserve (never above it); ties go to the tenant listed first;
    - the result depends only on the arguments.

    Each slot moved lowers the excess by exactly one, and there is always a slot to move: the
    lenders lend what the borrowers borrow, and no lender lends more of its reserve than it
    lends in all, so the non-preemptible tenants borrow at least the excess.
    """
    nominal = nominal_shares(pool)
    preemptible = preemptible_tenants(pool)
    held = {t.name: min(reserves.get(t.name, 0), nominal[t.name]) for t in pool.tenants}
    order = [t.name for t in pool.tenants]
    result = {name: limits[name] for name in order}
    excess = reserve_excess(result, pool, held)
    while excess > 0:
        donor = max(
            (n for n in order if n not in preemptible and result[n] > nominal[n]),
            key=lambda n: (result[n] - nominal[n], -order.index(n)),
        )
        taker = max(
            (n for n in order if result[n] < held[n]),
            key=lambda n: (held[n] - result[n], -order.index(n)),
        )
        result[donor] -= 1
        result[taker] += 1
        excess -= 1
    return result


def validate_limits(
    limits: Mapping[str, int], pool: PoolConfig, *, reserves: Mapping[str, int] | None = None
) -> None:
    """Raise InvalidAllocation unless `limits` names exactly the pool's tenants, each limit is a
    whole number within [floor, ceiling], and the limits sum to the budget; and, when `reserves`
    is given, unless they obey the reserve rule (controlplane/core/reserves.py) for them.

    Without `reserves` only the budget and the bounds are checked: that is what an outside answer
    (the agent's) must meet before `hold_reserves` may repair it."""
    expected = {t.name for t in pool.tenants}
    if set(limits) != expected:
        missing = sorted(expected - set(limits))
        unknown = sorted(set(limits) - expected)
        raise InvalidAllocation(
            f"tenants do not match the pool: missing {missing}, unknown {unknown}"
        )
    for tenant in pool.tenants:
        value = limits[tenant.name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidAllocation(f"limit of {tenant.name} is not a whole number: {value!r}")
        ceiling = pool.ceiling_of(tenant)
        if not tenant.floor_slots <= value <= ceiling:
            raise InvalidAllocation(
                f"limit of {tenant.name} ({value}) is outside [{tenant.floor_slots}, {ceiling}]"
            )
    total = sum(limits.values())
    if total != pool.budget_slots:
        raise InvalidAllocation(f"limits sum to {total}, not to the budget ({pool.budget_slots})")
    if reserves is not None:
        excess = reserve_excess(limits, pool, reserves)
        if excess > 0:
            raise InvalidAllocation(
                f"non-preemptible tenants hold {excess} slots of the lenders' reserves {dict(reserves)}"
            )


class ReferenceSloPolicy:
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
        pressure = {
            t.name: _slo_pressure(t, loads[t.name], settings.slo_boost) for t in pool.tenants
        }
        bounds = {
            t.name: _bounds(pool, t, nominal[t.name], learned, pressure[t.name])
            for t in pool.tenants
        }
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
    pool: PoolConfig,
    tenant: TenantConfig,
    nominal: int,
    learned: Mapping[str, int] | None,
    pressure: float,
) -> _Bounds:
    reserve = configured_reserve(tenant, nominal) if learned is None else learned[tenant.name]
    # Over its SLO, the reserve grows with the pressure, up to the nominal share.
    reserve = max(reserve, min(math.ceil(reserve * pressure), nominal))
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

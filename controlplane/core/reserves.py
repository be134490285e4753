"""Reserves: the part of a tenant's nominal share that only preemptible borrowers may hold.

A slot lent to a preemptible tenant comes back within one control round trip (its borrowed work
is paused, docs/preemption.md); a slot lent to any other tenant comes back only when the request
in it ends, seconds later. So each tenant has a reserve (at most its nominal share; from
`lendable_percent`, or learned by the slo policy, controlplane/core/learned_reserves.py), and
one rule holds for every policy's limits, the agent's answers included:

    the reserve rule:  sum over tenants T of max(0, reserve_T - limit_T)
                         <= sum over preemptible tenants B of max(0, limit_B - nominal_B)

The left side is what lenders have lent out of their reserves, the right side what preemptible
tenants borrow. Since the limits and the nominal shares both sum to the budget, what all lenders
lend equals what all borrowers borrow, so the rule says the same as: non-preemptible tenants hold
above their nominal shares only what the lenders' lendable parts (nominal - reserve) give. With
no preemptible tenant it says that every tenant holds at least its reserve.

`hold_reserves` repairs any valid set of limits to obey the rule; the decision loop applies it to
every decision before validation, and validation rejects limits that still break it.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from slotshift.apportion import nominal_shares
from slotshift.config import PoolConfig, TenantConfig


@runtime_checkable
class HoldsReserves(Protocol):
    """A policy state that names the reserves its decision was made with (the slo policy's
    learned reserves); None means the configured ones (`configured_reserves`)."""

    @property
    def reserves(self) -> Mapping[str, int] | None: ...


def configured_reserve(tenant: TenantConfig, nominal: int) -> int:
    """The reserve `lendable_percent` sets: the nominal share less its lendable part, at least the
    floor; never above `nominal` (a floor is never above the nominal share)."""
    lendable = round(nominal * tenant.lendable_percent / 100)
    return min(nominal, max(tenant.floor_slots, nominal - lendable))


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


def describe_moves(before: Mapping[str, int], after: Mapping[str, int]) -> str:
    """The tenants whose limit `hold_reserves` changed, as "A +3, C -3" (in `after`'s order)."""
    return ", ".join(
        f"{name} {after[name] - before[name]:+d}" for name in after if after[name] != before[name]
    )

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
Each function works on whole arrays (controlplane/core/columns.py); the `_column` forms take and
give arrays in the pool's tenant order, the others mappings. Their per-tenant form is kept as the
reference they must equal (tests/unit/controlplane/reference_policy.py).
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from controlplane.core.columns import Counts, PoolColumns, configured_reserve, pool_columns
from slotshift.config import PoolConfig

__all__ = [
    "HoldsReserves",
    "configured_reserve",
    "configured_reserves",
    "describe_moves",
    "excess_of",
    "hold_reserves",
    "hold_reserves_column",
    "preemptible_tenants",
    "reserve_excess",
    "reserves_in_force",
    "reserves_in_force_column",
]


@runtime_checkable
class HoldsReserves(Protocol):
    """A policy state that names the reserves its decision was made with (the slo policy's
    learned reserves); None means the configured ones (`configured_reserves`)."""

    @property
    def reserves(self) -> Mapping[str, int] | None: ...


def configured_reserves(pool: PoolConfig) -> dict[str, int]:
    """Every tenant's `configured_reserve`, against its nominal share."""
    columns = pool_columns(pool)
    return columns.mapping(columns.configured_reserve)


def reserves_in_force(pool: PoolConfig, policy_state: object | None) -> dict[str, int]:
    """The reserves a decision must hold: those the policy state names (HoldsReserves), else the
    configured ones; a tenant the state does not name gets its configured reserve, and each is
    clamped to [floor, nominal share] (a reserve above the nominal share could not be held)."""
    columns = pool_columns(pool)
    return columns.mapping(reserves_in_force_column(columns, policy_state))


def reserves_in_force_column(columns: PoolColumns, policy_state: object | None) -> Counts:
    """`reserves_in_force` as an array in the pool's order."""
    named = policy_state.reserves if isinstance(policy_state, HoldsReserves) else None
    if not named:
        return columns.configured_reserve
    values = columns.column(named, default=columns.configured_reserve)
    clamped: Counts = np.minimum(columns.nominal, np.maximum(columns.floor, values))
    return clamped


def preemptible_tenants(pool: PoolConfig) -> frozenset[str]:
    """Tenants whose borrowed work is paused when a lender needs its slots back: those that opted
    in (`preemptible`), while the pool's preemption is enabled (otherwise nobody is)."""
    return pool_columns(pool).preemptible_names


def reserve_excess(limits: Mapping[str, int], pool: PoolConfig, reserves: Mapping[str, int]) -> int:
    """How many slots of the lenders' reserves non-preemptible tenants hold: the left side of the
    reserve rule less its right side. The rule holds when this is at most 0.

    `limits` must name every tenant of the pool; `reserves` may omit tenants (reserve 0).
    """
    columns = pool_columns(pool)
    return excess_of(columns, columns.column(limits), columns.column(reserves, _zeros(columns)))


def excess_of(columns: PoolColumns, limits: Counts, reserves: Counts) -> int:
    """`reserve_excess` over arrays in the pool's order."""
    held = np.minimum(reserves, columns.nominal)
    lent_from_reserves = int(np.maximum(0, held - limits).sum())
    borrowed = np.maximum(0, limits - columns.nominal)
    return lent_from_reserves - int(borrowed[columns.preemptible].sum())


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
    columns = pool_columns(pool)
    held = hold_reserves_column(
        columns, columns.column(limits), columns.column(reserves, _zeros(columns))
    )
    return columns.mapping(held)


def hold_reserves_column(columns: PoolColumns, limits: Counts, reserves: Counts) -> Counts:
    """`hold_reserves` over arrays in the pool's order (a new array; the inputs are not written).

    The slots move one at a time in the contract; since the donors (above their nominal share)
    and the takers (below their reserve, at most their nominal share) are different tenants,
    the moves from the donors and those to the takers do not interact, and each side is a
    water level: `_from_the_top`.
    """
    held = np.minimum(reserves, columns.nominal)
    excess = excess_of(columns, limits, held)
    result = limits.copy()
    if excess <= 0:
        return result
    above = np.where(~columns.preemptible & (limits > columns.nominal), limits - columns.nominal, 0)
    below = np.where(limits < held, held - limits, 0)
    result -= _from_the_top(above, excess)
    result += _from_the_top(below, excess)
    return result


def _from_the_top(amounts: Counts, count: int) -> Counts:
    """How much each entry loses when `count` units are taken one at a time from the largest
    positive entry, ties to the first: every entry above a level L comes down to L, and the
    first few at L (by position) give one more. ValueError when the entries hold fewer than
    `count` (the one-at-a-time loop would find no entry to take from)."""
    if int(amounts.sum()) < count:
        raise ValueError(f"cannot take {count} from entries holding {int(amounts.sum())}")
    # The lowest level L at which cutting every entry down to L takes at most `count`.
    low, high = 0, int(amounts.max())
    while low < high:
        level = (low + high) // 2
        if int(np.maximum(0, amounts - level).sum()) <= count:
            high = level
        else:
            low = level + 1
    taken: Counts = np.maximum(0, amounts - low)
    left = count - int(taken.sum())
    if left > 0:
        # left < the entries at or above L, and L >= 1 (else nothing would be left).
        taken[np.flatnonzero(amounts >= low)[:left]] += 1
    return taken


def _zeros(columns: PoolColumns) -> Counts:
    return np.zeros(columns.size, dtype=np.int64)


def describe_moves(before: Mapping[str, int], after: Mapping[str, int]) -> str:
    """The tenants whose limit `hold_reserves` changed, as "A +3, C -3" (in `after`'s order)."""
    return ", ".join(
        f"{name} {after[name] - before[name]:+d}" for name in after if after[name] != before[name]
    )

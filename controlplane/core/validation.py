"""The check every decision passes before it is published."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.core.reserves import reserve_excess
from slotshift.config import PoolConfig


class InvalidAllocation(ValueError):
    """A set of tenant limits that breaks the budget or a bound; the message names the problem."""


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

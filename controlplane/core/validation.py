"""The check every decision passes before it is published: whole arrays (controlplane/core/
columns.py), so that it costs microseconds at 10,000 tenants; its per-tenant form is kept as the
reference it must equal (tests/unit/controlplane/reference_policy.py)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from controlplane.core.columns import Counts, PoolColumns, pool_columns
from controlplane.core.reserves import excess_of
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
    columns = pool_columns(pool)
    if limits.keys() != columns.name_set:
        expected = columns.name_set
        missing = sorted(expected - set(limits))
        unknown = sorted(set(limits) - expected)
        raise InvalidAllocation(
            f"tenants do not match the pool: missing {missing}, unknown {unknown}"
        )
    values = _whole_numbers(limits, columns)
    if values is None or not _within_bounds(values, columns):
        # Some limit is not a plain int or lies outside its bounds: name the first, in the
        # pool's order.
        _check_each(limits, pool)
        values = columns.column(limits)
    total = int(values.sum())
    if total != pool.budget_slots:
        raise InvalidAllocation(f"limits sum to {total}, not to the budget ({pool.budget_slots})")
    if reserves is not None:
        excess = excess_of(columns, values, columns.column(reserves, _zeros(columns.size)))
        if excess > 0:
            raise InvalidAllocation(
                f"non-preemptible tenants hold {excess} slots of the lenders' reserves {dict(reserves)}"
            )


def _whole_numbers(limits: Mapping[str, int], columns: PoolColumns) -> Counts | None:
    """The limits as an array in the pool's order when every one is a plain int that fits."""
    values = [limits[name] for name in columns.names]
    if not all(type(value) is int for value in values):
        return None
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return None


def _within_bounds(values: Counts, columns: PoolColumns) -> bool:
    return bool(((columns.floor <= values) & (values <= columns.ceiling)).all())


def _check_each(limits: Mapping[str, int], pool: PoolConfig) -> None:
    """Raise InvalidAllocation for the first tenant whose limit is not a whole number or lies
    outside [floor, ceiling]."""
    for tenant in pool.tenants:
        value = limits[tenant.name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidAllocation(f"limit of {tenant.name} is not a whole number: {value!r}")
        ceiling = pool.ceiling_of(tenant)
        if not tenant.floor_slots <= value <= ceiling:
            raise InvalidAllocation(
                f"limit of {tenant.name} ({value}) is outside [{tenant.floor_slots}, {ceiling}]"
            )


def _zeros(size: int) -> Counts:
    return np.zeros(size, dtype=np.int64)

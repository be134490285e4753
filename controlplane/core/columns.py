"""A pool config's per-tenant figures as arrays, computed once per config.

The reserve rule, validation and the slo policy each pass over every tenant of the pool every
decision; at 10,000 tenants per-tenant Python costs tens of milliseconds per pass, where a numpy
pass costs tens of microseconds. What those passes read of the config (floors, ceilings,
weights, nominal shares, reserves, borrowing bounds, SLOs, who is preemptible) changes only
with the config, so it is gathered here once per config, each figure computed by the same
per-tenant function the rest of the code uses (so no figure can differ), in the pool's tenant
order.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from slotshift.apportion import nominal_shares
from slotshift.config import PoolConfig, TenantConfig

Counts = NDArray[np.int64]
"""Whole slots, one per tenant in the pool's order."""

Floats = NDArray[np.float64]
"""One real figure per tenant in the pool's order."""

Flags = NDArray[np.bool_]
"""One flag per tenant in the pool's order."""

_Array = TypeVar("_Array", bound=np.ndarray[Any, Any])


def configured_reserve(tenant: TenantConfig, nominal: int) -> int:
    """The reserve `lendable_percent` sets: the nominal share less its lendable part, at least the
    floor; never above `nominal` (a floor is never above the nominal share)."""
    lendable = round(nominal * tenant.lendable_percent / 100)
    return min(nominal, max(tenant.floor_slots, nominal - lendable))


def borrowing_upper(pool: PoolConfig, tenant: TenantConfig, nominal: int) -> int:
    """The most the tenant may hold by its own bounds: its ceiling, and its nominal share plus
    `borrowing_limit_percent` of it when that is set (may lie below the nominal share when the
    ceiling does)."""
    ceiling = pool.ceiling_of(tenant)
    if tenant.borrowing_limit_percent is None:
        return ceiling
    return min(ceiling, nominal + round(nominal * tenant.borrowing_limit_percent / 100))


@dataclass(frozen=True, slots=True, eq=False)
class PoolColumns:
    """One pool config's tenants as arrays, in the pool's order. Never written after it is built
    (the arrays are read-only)."""

    names: tuple[str, ...]
    name_set: frozenset[str]
    nominal_shares: Mapping[str, int]
    """The config's nominal shares (read it, never change it: `nominal_shares` gives a copy)."""
    floor: Counts
    ceiling: Counts
    """PoolConfig.ceiling_of each tenant."""
    weight: Floats
    nominal: Counts
    configured_reserve: Counts
    """`configured_reserve` of each tenant against its nominal share."""
    borrowing_upper: Counts
    """`borrowing_upper` of each tenant."""
    preemptible: Flags
    """reserves.preemptible_tenants as flags: opted in, while the pool's preemption is on."""
    preemptible_names: frozenset[str]
    ttft_slo_ms: Floats
    """The tenant's TTFT SLO; NaN where it has none."""
    e2e_slo_ms: Floats
    """As `ttft_slo_ms`."""

    @property
    def size(self) -> int:
        return len(self.names)

    @classmethod
    def of(cls, pool: PoolConfig) -> PoolColumns:
        """The columns of `pool` (built anew; `pool_columns` remembers them per config)."""
        tenants = pool.tenants
        names = tuple(t.name for t in tenants)
        shares = nominal_shares(pool)
        nominal = [shares[name] for name in names]
        enabled = pool.preemption.enabled
        preemptible = [enabled and t.preemptible for t in tenants]
        return cls(
            names=names,
            name_set=frozenset(names),
            nominal_shares=shares,
            floor=_frozen(np.array([t.floor_slots for t in tenants], dtype=np.int64)),
            ceiling=_frozen(np.array([pool.ceiling_of(t) for t in tenants], dtype=np.int64)),
            weight=_frozen(np.array([t.weight for t in tenants], dtype=np.float64)),
            nominal=_frozen(np.array(nominal, dtype=np.int64)),
            configured_reserve=_frozen(
                np.array(
                    [configured_reserve(t, n) for t, n in zip(tenants, nominal, strict=True)],
                    dtype=np.int64,
                )
            ),
            borrowing_upper=_frozen(
                np.array(
                    [borrowing_upper(pool, t, n) for t, n in zip(tenants, nominal, strict=True)],
                    dtype=np.int64,
                )
            ),
            preemptible=_frozen(np.array(preemptible, dtype=np.bool_)),
            preemptible_names=frozenset(
                name for name, flag in zip(names, preemptible, strict=True) if flag
            ),
            ttft_slo_ms=_frozen(np.array([_slo(t.ttft_slo_ms) for t in tenants], dtype=np.float64)),
            e2e_slo_ms=_frozen(np.array([_slo(t.e2e_slo_ms) for t in tenants], dtype=np.float64)),
        )

    def column(self, values: Mapping[str, int], default: Counts | None = None) -> Counts:
        """`values[name]` for every tenant, as an int64 array; a tenant `values` does not name
        gets `default`'s figure (KeyError without one, as `values[name]` would raise)."""
        if default is None:
            return np.array([values[name] for name in self.names], dtype=np.int64)
        get = values.get
        return np.array(
            [
                get(name, fallback)
                for name, fallback in zip(self.names, default.tolist(), strict=True)
            ],
            dtype=np.int64,
        )

    def mapping(self, values: Counts) -> dict[str, int]:
        """An array of per-tenant counts as a dict in the pool's order (Python ints)."""
        return dict(zip(self.names, values.tolist(), strict=True))


def _slo(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _frozen(array: _Array) -> _Array:
    array.setflags(write=False)
    return array


class _ColumnsMemo:
    """The columns of the last few pool configs, by identity (as apportion's nominal-share memo:
    a config is immutable, a changed one is a new object). Bounded, holding nothing but configs
    and their columns, so one memo serves the process."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[int, tuple[PoolConfig, PoolColumns]] = OrderedDict()

    def columns(self, pool: PoolConfig) -> PoolColumns:
        entry = self._entries.get(id(pool))
        if entry is not None and entry[0] is pool:
            self._entries.move_to_end(id(pool))
            return entry[1]
        columns = PoolColumns.of(pool)
        self._entries[id(pool)] = (pool, columns)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return columns


_COLUMNS_MEMO = _ColumnsMemo(size=16)


def pool_columns(pool: PoolConfig) -> PoolColumns:
    """`pool`'s columns, computed on the first call for this config object and remembered."""
    return _COLUMNS_MEMO.columns(pool)

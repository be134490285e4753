"""Allocations: immutable, versioned snapshots of what every gateway of a pool may admit.

A pool's per-gateway limits are held as read-only arrays (`CellLimits`: gateways x tenants), so
that building, comparing and diffing an allocation of 100,000 cells costs a few array passes;
`Allocation.gateways` reads them as the mapping of `GatewayLimit`s that callers and the query
API know, building a GatewayLimit only for a cell that is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

NO_PAUSE = -1
"""In `CellLimits.pauses`: nothing of the tenant is paused at that gateway."""


@dataclass(frozen=True, slots=True)
class GatewayLimit:
    """One tenant's limit on one gateway."""

    target_slots: int
    """The gateway's part of the tenant's pool-wide limit."""
    limit_slots: int
    """What the gateway may admit now (at most target_slots; lower while slots drain elsewhere)."""
    pause_above_slots: int | None = None
    """Set for a preemptible tenant whose borrowed work a lender needs back: the gateway pauses
    its running requests until at most this many run (controlplane/core/preemption.py)."""


def _frozen(values: NDArray[np.int64]) -> NDArray[np.int64]:
    frozen = np.array(values, dtype=np.int64, copy=True)
    frozen.flags.writeable = False
    return frozen


@dataclass(frozen=True, slots=True, eq=False)
class CellLimits:
    """Every gateway's limits for every tenant: row i is `gateway_ids[i]`, column j `tenants[j]`.

    The arrays are copies made read-only at construction: an allocation never changes.
    """

    gateway_ids: tuple[str, ...]
    tenants: tuple[str, ...]
    targets: NDArray[np.int64]
    limits: NDArray[np.int64]
    pauses: NDArray[np.int64]
    """NO_PAUSE, or the most of the tenant's requests that may keep running there."""
    pool_limits: NDArray[np.int64]
    """Each tenant's pool-wide limit (shape (tenants,)): what the targets split."""

    @classmethod
    def of(
        cls,
        gateway_ids: tuple[str, ...],
        tenants: tuple[str, ...],
        targets: NDArray[np.int64],
        limits: NDArray[np.int64],
        pauses: NDArray[np.int64],
        pool_limits: NDArray[np.int64] | None = None,
    ) -> CellLimits:
        """Cells from arrays of shape (len(gateway_ids), len(tenants)), copied. `pool_limits`
        defaults to the targets' column sums (every column of a split sums to its limit)."""
        shape = (len(gateway_ids), len(tenants))
        for name, values in (("targets", targets), ("limits", limits), ("pauses", pauses)):
            if values.shape != shape:
                raise ValueError(f"{name}: shape {values.shape}, expected {shape}")
        if pool_limits is None:
            pool_limits = targets.sum(axis=0, dtype=np.int64)
        if pool_limits.shape != (len(tenants),):
            raise ValueError(f"pool_limits: shape {pool_limits.shape}, expected ({len(tenants)},)")
        return cls(
            gateway_ids,
            tenants,
            _frozen(targets),
            _frozen(limits),
            _frozen(pauses),
            _frozen(pool_limits),
        )

    @classmethod
    def empty(cls, tenants: tuple[str, ...]) -> CellLimits:
        """No gateway."""
        none = np.zeros((0, len(tenants)), dtype=np.int64)
        return cls.of((), tenants, none, none, none)

    def row(self, gateway_id: str) -> int | None:
        """The row of `gateway_id`; None if it has none."""
        try:
            return self.gateway_ids.index(gateway_id)
        except ValueError:
            return None

    def same(self, other: CellLimits) -> bool:
        """Whether both say exactly the same for every cell."""
        return (
            self.gateway_ids == other.gateway_ids
            and self.tenants == other.tenants
            and np.array_equal(self.targets, other.targets)
            and np.array_equal(self.limits, other.limits)
            and np.array_equal(self.pauses, other.pauses)
            and np.array_equal(self.pool_limits, other.pool_limits)
        )


class _GatewayView(Mapping[str, GatewayLimit]):
    """One gateway's row, read as tenant -> GatewayLimit."""

    __slots__ = ("_cells", "_row")

    def __init__(self, cells: CellLimits, row: int) -> None:
        self._cells = cells
        self._row = row

    def __getitem__(self, tenant: str) -> GatewayLimit:
        try:
            column = self._cells.tenants.index(tenant)
        except ValueError:
            raise KeyError(tenant) from None
        return self._limit(column)

    def _limit(self, column: int) -> GatewayLimit:
        cells, row = self._cells, self._row
        pause = int(cells.pauses[row, column])
        return GatewayLimit(
            int(cells.targets[row, column]),
            int(cells.limits[row, column]),
            None if pause == NO_PAUSE else pause,
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self._cells.tenants)

    def __len__(self) -> int:
        return len(self._cells.tenants)


class _GatewaysView(Mapping[str, Mapping[str, GatewayLimit]]):
    """Every gateway's row, read as gateway id -> tenant -> GatewayLimit."""

    __slots__ = ("_cells",)

    def __init__(self, cells: CellLimits) -> None:
        self._cells = cells

    def __getitem__(self, gateway_id: str) -> Mapping[str, GatewayLimit]:
        row = self._cells.row(gateway_id)
        if row is None:
            raise KeyError(gateway_id)
        return _GatewayView(self._cells, row)

    def __iter__(self) -> Iterator[str]:
        return iter(self._cells.gateway_ids)

    def __len__(self) -> int:
        return len(self._cells.gateway_ids)


@dataclass(frozen=True, slots=True)
class Allocation:
    """A pool's allocation at one version. Never mutated: a change is a new Allocation."""

    pool: str
    version: int
    decision_id: int
    policy: str
    budget_slots: int
    created_at_wall_s: float
    tenant_limits: Mapping[str, int]
    """Pool-wide limit per tenant; sums to budget_slots."""
    cells: CellLimits
    """Every connected gateway's limits."""

    @property
    def gateways(self) -> Mapping[str, Mapping[str, GatewayLimit]]:
        """gateway id -> tenant -> its limits there (read from `cells`)."""
        return _GatewaysView(self.cells)

    def same_limits(self, other: Allocation) -> bool:
        """Whether `other` enforces exactly what this one does (versions aside)."""
        return self.tenant_limits == other.tenant_limits and self.cells.same(other.cells)

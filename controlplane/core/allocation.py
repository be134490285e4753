"""Allocations: immutable, versioned snapshots of what every gateway of a pool may admit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


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
    gateways: Mapping[str, Mapping[str, GatewayLimit]]
    """gateway id -> tenant -> its limits there."""

    def same_limits(self, other: Allocation) -> bool:
        """Whether `other` enforces exactly what this one does (versions aside)."""
        return self.tenant_limits == other.tenant_limits and self.gateways == other.gateways

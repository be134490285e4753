"""The demand policy: the study's controller, moving the budget toward where the demand is."""

from __future__ import annotations

from controlplane.core.policy import PolicyDecision
from controlplane.core.snapshot import PoolSnapshot, TenantLoad
from slotshift.apportion import Claim, apportion, nominal_shares
from slotshift.config import PoolConfig


class DemandPolicy:
    """Each period, split the budget in proportion to weighted demand, floors and ceilings kept.

    A tenant's demand is what it runs plus what waits at the gateways. Tenants with no demand
    keep their floor; slots nobody asks for go to the tenants that have demand (work
    conserving: while A idles, B may use all but A's floor). With no demand anywhere the
    nominal shares apply, so a pool at rest looks like the static split.
    """

    name = "demand"
    needs_advice = False

    def decide(
        self, snapshot: PoolSnapshot, pool: PoolConfig, state: object | None
    ) -> PolicyDecision:
        demand = {
            t.name: snapshot.tenants.get(t.name, TenantLoad()).demand_slots for t in pool.tenants
        }
        if not any(demand.values()):
            return PolicyDecision(limits=nominal_shares(pool), reason="no demand: nominal shares")
        claims = [
            Claim(t.floor_slots, pool.ceiling_of(t), demand[t.name] * t.weight)
            for t in pool.tenants
        ]
        limits = dict(
            zip((t.name for t in pool.tenants), apportion(pool.budget_slots, claims), strict=True)
        )
        described = ", ".join(f"{name}={value}" for name, value in demand.items())
        return PolicyDecision(
            limits=limits, reason=f"proportional to weighted demand ({described})"
        )

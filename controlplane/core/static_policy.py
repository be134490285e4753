"""The static policy: each tenant's nominal share, frozen (the study's baseline {48, 48})."""

from __future__ import annotations

from controlplane.core.policy import PolicyDecision
from controlplane.core.snapshot import PoolSnapshot
from slotshift.apportion import nominal_shares
from slotshift.config import PoolConfig


class StaticPolicy:
    """Limits are the nominal shares by weight within floors and ceilings, whatever the load."""

    name = "static"
    needs_advice = False

    def decide(
        self, snapshot: PoolSnapshot, pool: PoolConfig, state: object | None
    ) -> PolicyDecision:
        return PolicyDecision(limits=nominal_shares(pool), reason="nominal shares by weight")

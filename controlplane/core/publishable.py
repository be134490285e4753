"""What the control loop does to every policy's decision before it may be published.

The loop (controlplane/decision_loop.py) and the deterministic twin (slotshift_tools/twin/)
both call this one function, so that a decision is held to the reserves and validated the same
way wherever it is made.
"""

from __future__ import annotations

import dataclasses

from controlplane.core.policy import PolicyDecision
from controlplane.core.reserves import describe_moves, hold_reserves, reserves_in_force
from controlplane.core.validation import validate_limits
from slotshift.config import PoolConfig


def holding_reserves(decision: PolicyDecision, pool: PoolConfig) -> PolicyDecision:
    """The decision with its limits made to obey the reserve rule for the reserves its state names
    (the reason says what moved), validated; InvalidAllocation when it cannot be published."""
    validate_limits(decision.limits, pool)
    reserves = reserves_in_force(pool, decision.state)
    held = hold_reserves(decision.limits, pool, reserves)
    # A repair that does not obey the rule would be a bug in hold_reserves: never published.
    validate_limits(held, pool, reserves=reserves)
    if held == dict(decision.limits):
        return decision
    reason = f"{decision.reason}; reserves held: {describe_moves(decision.limits, held)}"
    return dataclasses.replace(decision, limits=held, reason=reason)

"""What the control loop does to every policy's decision before it may be published.

The loop (controlplane/decision_loop.py) and the deterministic twin (slotshift_tools/twin/)
both call this one function, so that a decision is held to the reserves and validated the same
way wherever it is made.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from controlplane.core.columns import pool_columns
from controlplane.core.policy import PolicyDecision
from controlplane.core.reserves import (
    describe_moves,
    excess_of,
    hold_reserves_column,
    reserves_in_force_column,
)
from controlplane.core.validation import InvalidAllocation, validate_limits
from slotshift.config import PoolConfig


def holding_reserves(decision: PolicyDecision, pool: PoolConfig) -> PolicyDecision:
    """The decision with its limits made to obey the reserve rule for the reserves its state names
    (the reason says what moved), validated; InvalidAllocation when it cannot be published."""
    validate_limits(decision.limits, pool)
    columns = pool_columns(pool)
    reserves = reserves_in_force_column(columns, decision.state)
    limits = columns.column(decision.limits)
    held = hold_reserves_column(columns, limits, reserves)
    # A repair that does not obey the rule would be a bug in hold_reserves: never published
    # (validate_limits' check, on the arrays already at hand).
    excess = excess_of(columns, held, reserves)
    if excess > 0:
        raise InvalidAllocation(
            f"non-preemptible tenants hold {excess} slots of the lenders' reserves "
            f"{columns.mapping(reserves)}"
        )
    if np.array_equal(held, limits):
        return decision
    repaired = columns.mapping(held)
    validate_limits(repaired, pool)
    reason = f"{decision.reason}; reserves held: {describe_moves(decision.limits, repaired)}"
    return dataclasses.replace(decision, limits=repaired, reason=reason)

"""The agent policy: the study's named next step, an LLM as the decision function.

The LLM is asked outside the policy (the control loop gathers its answer, with a deadline, into
`snapshot.advice`); this policy only judges the answer. An answer is used when it names exactly
the pool's tenants with whole numbers that hold every floor and ceiling and sum to the budget.
Otherwise (late, failed, unparseable, invalid) the rule-based fallback policy decides, and the
decision says why (`PolicyDecision.fallback`). A used answer is made to hold the reserves
(controlplane/core/reserves.py: the fallback's learned reserves, or the configured ones): slots
it lends out of a reserve to a tenant that is not preemptible go back, and the reason says so. The fallback runs on every decision, used or not,
so that its own memory (the slo policy's smoothed demand) stays current.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.core.policy import AllocationPolicy, PolicyDecision
from controlplane.core.reserves import (
    HoldsReserves,
    describe_moves,
    hold_reserves,
    reserves_in_force,
)
from controlplane.core.snapshot import Advice, PoolSnapshot
from controlplane.core.validation import InvalidAllocation, validate_limits
from slotshift.config import PoolConfig

MAX_REASON_CHARS = 300


@dataclass(frozen=True, slots=True)
class AgentPolicyState:
    fallback_state: object | None
    fallbacks: int
    """Decisions so far that the fallback made."""

    @property
    def reserves(self) -> Mapping[str, int] | None:
        """The fallback's learned reserves, which the agent's answers hold too
        (reserves.HoldsReserves); None when the fallback learns none."""
        inner = self.fallback_state
        return inner.reserves if isinstance(inner, HoldsReserves) else None


class AgentPolicy:
    """Uses the agent's answer when it is valid; otherwise the fallback policy's decision."""

    name = "agent"
    needs_advice = True

    def __init__(self, fallback: AllocationPolicy) -> None:
        self.fallback = fallback

    def decide(
        self, snapshot: PoolSnapshot, pool: PoolConfig, state: object | None
    ) -> PolicyDecision:
        previous = state if isinstance(state, AgentPolicyState) else AgentPolicyState(None, 0)
        rule_based = self.fallback.decide(snapshot, pool, previous.fallback_state)
        try:
            limits = usable_limits(snapshot.advice, pool)
        except InvalidAllocation as problem:
            return PolicyDecision(
                limits=rule_based.limits,
                reason=f"fell back to {self.fallback.name} ({problem}): {rule_based.reason}",
                state=AgentPolicyState(rule_based.state, previous.fallbacks + 1),
                fallback=str(problem),
            )
        assert snapshot.advice is not None  # usable_limits checked it
        reason = snapshot.advice.reason.strip()[:MAX_REASON_CHARS] or "no reason given"
        next_state = AgentPolicyState(rule_based.state, previous.fallbacks)
        held = hold_reserves(limits, pool, reserves_in_force(pool, next_state))
        reason = f"agent ({snapshot.advice.latency_ms:.0f} ms): {reason}"
        if held != limits:
            reason = f"{reason}; reserves held: {describe_moves(limits, held)}"
        return PolicyDecision(limits=held, reason=reason, state=next_state)


def usable_limits(advice: Advice | None, pool: PoolConfig) -> dict[str, int]:
    """The advice's limits if they can be published as they are; InvalidAllocation says why not,
    starting with a kind: missing, late, failed, unparseable (from the advisor) or invalid."""
    if advice is None:
        raise InvalidAllocation("missing: no answer was gathered")
    if advice.error is not None:
        raise InvalidAllocation(advice.error)
    if not isinstance(advice.limits, Mapping):
        raise InvalidAllocation("invalid: the answer has no limits object")
    limits: dict[str, int] = {}
    for tenant, value in advice.limits.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidAllocation(
                f"invalid: limit of {tenant!r} is not a whole number: {value!r}"
            )
        limits[str(tenant)] = value
    try:
        validate_limits(limits, pool)
    except InvalidAllocation as problem:
        raise InvalidAllocation(f"invalid: {problem}") from None
    return limits

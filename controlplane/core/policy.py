"""The interface every allocation policy implements, and what a decision returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from controlplane.core.snapshot import PoolSnapshot
from slotshift.config import PoolConfig


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """A policy's answer: the pool-wide limit of every tenant, and why."""

    limits: Mapping[str, int]
    reason: str
    state: object | None = None
    """Carried to the policy's next decision unchanged; the policy's own memory."""
    fallback: str | None = None
    """Set when the policy could not use its primary source and fell back: why."""


class AllocationPolicy(Protocol):
    """A pure function from (snapshot, pool config, previous state) to a decision.

    Contract, for every implementation (tests/unit/controlplane/test_policies.py enforces it on
    random sequences of snapshots):
    - the limits name exactly the pool's tenants and sum to `pool.budget_slots`;
    - each limit lies within the tenant's [floor_slots, ceiling] (see PoolConfig.ceiling_of);
    - the result depends only on the arguments: no I/O, no clock (time is `snapshot.now_s`),
      no randomness that is not seeded from the arguments.
    A policy that cannot decide raises; the control loop then keeps the last good allocation.
    """

    name: str
    needs_advice: bool
    """True when the control loop must gather an outside answer (snapshot.advice) first."""

    def decide(
        self, snapshot: PoolSnapshot, pool: PoolConfig, state: object | None
    ) -> PolicyDecision: ...

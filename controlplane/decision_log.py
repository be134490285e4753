"""The decision log: what each decision saw, chose and why, for GetDecisions and traces."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.core.snapshot import TelemetryView, TenantLoad


class DecisionOutcome(enum.Enum):
    PUBLISHED = "published"
    """The limits changed and a new allocation version was published."""
    HELD = "held"
    """The policy kept the limits as they were."""
    REJECTED = "rejected"
    """The policy failed or its answer was invalid; the last good allocation stays."""


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One decision, as GetDecisions returns it."""

    id: int
    pool: str
    decided_at_wall_s: float
    policy: str
    trigger: str
    """Why it ran when it did: "period", or the fast path's reason."""
    outcome: DecisionOutcome
    reason: str
    version: int
    """The allocation version in force after the decision."""
    budget_slots: int
    inputs: Mapping[str, TenantLoad]
    telemetry: TelemetryView | None
    outputs: Mapping[str, int]
    """The tenant limits in force after the decision."""
    duration_ms: float
    fallback: str | None = None
    """Why the policy fell back from its primary source (the agent's answer), if it did."""


class DecisionLog:
    """The most recent decisions of one pool, bounded."""

    def __init__(self, capacity: int) -> None:
        self._records: deque[DecisionRecord] = deque(maxlen=capacity)
        self._next_id = 1

    def next_id(self) -> int:
        """Reserve the id of the next decision."""
        decision_id = self._next_id
        self._next_id += 1
        return decision_id

    def append(self, record: DecisionRecord) -> None:
        self._records.append(record)

    def newest(self, limit: int) -> list[DecisionRecord]:
        """Up to `limit` records, newest first."""
        return list(reversed(self._records))[:limit]

    def __len__(self) -> int:
        return len(self._records)

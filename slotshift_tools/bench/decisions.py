"""The controller's trajectory in the steady window, from its decision log (GetDecisions).

The study reports "15 moves toward A, 19 toward B, 11 holds". Here a decision is a move toward a
tenant when it was published and raised that tenant's limit over the limits in force before it
(the previous decision that was not rejected); a hold is a decision whose outcome was HELD (the
policy kept the limits). With more than two tenants one decision can move toward several.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

PUBLISHED = "published"
HELD = "held"
REJECTED = "rejected"


@dataclass(frozen=True)
class DecisionView:
    """What the harness keeps of one decision."""

    id: int
    decided_at_wall_s: float
    """Unix seconds (the control plane's clock)."""
    outcome: str
    """"published", "held" or "rejected"."""
    outputs: Mapping[str, int]
    """The tenant limits in force after the decision."""
    reason: str = ""


@dataclass(frozen=True)
class Trajectory:
    """The decisions taken inside a window, counted."""

    decisions: int
    published: int
    holds: int
    rejected: int
    moves_toward: Mapping[str, int]
    """Published decisions that raised each tenant's limit (every tenant is present)."""

    @property
    def moves(self) -> int:
        """Published decisions (each moved slots toward at least one tenant)."""
        return self.published


def trajectory(
    decisions: Iterable[DecisionView],
    *,
    start_wall_s: float,
    end_wall_s: float,
    tenants: Sequence[str],
) -> Trajectory:
    """Count the decisions taken in [start_wall_s, end_wall_s].

    `decisions` may hold decisions from before the window: they give the limits the first
    decision in it is compared with. A published decision with no earlier decision known counts
    as published but as a move toward nobody.
    """
    moves = dict.fromkeys(tenants, 0)
    counted = published = holds = rejected = 0
    in_force: Mapping[str, int] | None = None
    for decision in sorted(decisions, key=lambda d: d.id):
        inside = start_wall_s <= decision.decided_at_wall_s <= end_wall_s
        if inside:
            counted += 1
            if decision.outcome == PUBLISHED:
                published += 1
                if in_force is not None:
                    for tenant in tenants:
                        if decision.outputs.get(tenant, 0) > in_force.get(tenant, 0):
                            moves[tenant] += 1
            elif decision.outcome == HELD:
                holds += 1
            elif decision.outcome == REJECTED:
                rejected += 1
        if decision.outcome != REJECTED:
            in_force = decision.outputs
    return Trajectory(
        decisions=counted,
        published=published,
        holds=holds,
        rejected=rejected,
        moves_toward=moves,
    )


def merge(known: dict[int, DecisionView], fetched: Iterable[DecisionView]) -> None:
    """Add fetched decisions to `known` by id (the log is polled; pages overlap)."""
    for decision in fetched:
        known[decision.id] = decision

"""The controller's trajectory: moves toward each tenant, holds, inside the window."""

from __future__ import annotations

from slotshift_tools.bench.decisions import (
    HELD,
    PUBLISHED,
    REJECTED,
    DecisionView,
    merge,
    trajectory,
)


def _d(id_: int, at: float, outcome: str, a: int, b: int) -> DecisionView:
    return DecisionView(id=id_, decided_at_wall_s=at, outcome=outcome, outputs={"A": a, "B": b})


DECISIONS = [
    _d(1, 0.0, HELD, 48, 48),  # before the window: gives the limits in force
    _d(2, 2.0, PUBLISHED, 26, 70),  # toward B
    _d(3, 4.0, PUBLISHED, 4, 92),  # toward B
    _d(4, 6.0, REJECTED, 4, 92),
    _d(5, 8.0, HELD, 4, 92),
    _d(6, 10.0, PUBLISHED, 30, 66),  # toward A
    _d(7, 12.0, PUBLISHED, 4, 92),  # after the window
]


def test_moves_and_holds_in_the_window() -> None:
    path = trajectory(DECISIONS, start_wall_s=1.0, end_wall_s=10.0, tenants=["A", "B"])
    assert path.moves_toward == {"A": 1, "B": 2}
    assert path.holds == 1
    assert path.rejected == 1
    assert path.decisions == 5
    assert path.moves == 3


def test_the_order_given_does_not_matter() -> None:
    path = trajectory(
        list(reversed(DECISIONS)), start_wall_s=1.0, end_wall_s=10.0, tenants=["A", "B"]
    )
    assert path.moves_toward == {"A": 1, "B": 2}


def test_a_rejected_decision_does_not_change_the_limits_in_force() -> None:
    decisions = [
        _d(1, 0.0, PUBLISHED, 10, 86),
        _d(2, 1.0, REJECTED, 90, 6),
        _d(3, 2.0, PUBLISHED, 20, 76),  # compared with {10, 86}: toward A
    ]
    path = trajectory(decisions, start_wall_s=0.5, end_wall_s=3.0, tenants=["A", "B"])
    assert path.moves_toward == {"A": 1, "B": 0}


def test_a_first_decision_without_history_moves_toward_nobody() -> None:
    path = trajectory([_d(9, 5.0, PUBLISHED, 4, 92)], start_wall_s=0, end_wall_s=10, tenants=["A"])
    assert path.published == 1
    assert path.moves_toward == {"A": 0}


def test_every_tenant_is_listed_even_without_moves() -> None:
    path = trajectory([], start_wall_s=0, end_wall_s=1, tenants=["A", "B", "C"])
    assert path.moves_toward == {"A": 0, "B": 0, "C": 0}
    assert path.decisions == 0


def test_merge_keeps_one_decision_per_id() -> None:
    known: dict[int, DecisionView] = {}
    merge(known, DECISIONS[:3])
    merge(known, DECISIONS[2:5])
    assert sorted(known) == [1, 2, 3, 4, 5]

"""The budget check at every instant, from the gateways' side."""

from __future__ import annotations

import numpy as np
import pytest

from slotshift_tools.scale.budget import KEPT_VIOLATIONS, HeldLog, cell_id, check_budget

TENANTS = 2
BUDGET = 10


def events(rows: list[tuple[float, int, int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(wall s, gateway, tenant, held) rows as the check's arrays."""
    log = HeldLog()
    for wall_s, gateway, tenant, held in rows:
        log.record(wall_s, np.array([cell_id(gateway, tenant, TENANTS)]), np.array([held]))
    return log.arrays()


def test_a_safe_hand_over_passes() -> None:
    # Gateway 0 holds 6 of tenant 0, gateway 1 holds 4 of tenant 1; gateway 0 shrinks and
    # drains to 3 before gateway 1 is raised to 7.
    check = check_budget(
        *events([(0.0, 0, 0, 6), (0.0, 1, 1, 4), (1.0, 0, 0, 5), (1.5, 0, 0, 3), (2.0, 1, 1, 7)]),
        budget_slots=BUDGET,
    )
    assert check.ok
    assert check.violations == 0
    assert check.max_held_slots == 10
    assert check.events == 5
    assert check.instants == 4


def test_a_raise_before_the_drain_is_caught_with_its_instant() -> None:
    # Gateway 1 applies its raise at 1.2 s while gateway 0 still runs 5 (it drains at 1.5 s).
    check = check_budget(
        *events([(0.0, 0, 0, 6), (0.0, 1, 1, 4), (1.0, 0, 0, 5), (1.2, 1, 1, 7), (1.5, 0, 0, 3)]),
        budget_slots=BUDGET,
    )
    assert not check.ok
    assert check.violations == 1
    assert check.max_held_slots == 12
    assert check.max_held_at_wall_s == 1.2
    assert [(v.wall_s, v.held_slots) for v in check.first_violations] == [(1.2, 12)]


def test_events_of_one_instant_count_only_together() -> None:
    # One gateway applying one update moves slots between its tenants at once.
    check = check_budget(
        *events([(0.0, 0, 0, 8), (0.0, 0, 1, 2), (1.0, 0, 1, 6), (1.0, 0, 0, 4)]),
        budget_slots=BUDGET,
    )
    assert check.ok
    assert check.instants == 2


def test_processes_merge_in_any_order() -> None:
    first = events([(0.0, 0, 0, 6), (1.0, 0, 0, 5), (1.5, 0, 0, 3)])
    second = events([(0.0, 1, 1, 4), (1.2, 1, 1, 7)])
    merged = [np.concatenate([b, a]) for a, b in zip(first, second, strict=True)]
    check = check_budget(*merged, budget_slots=BUDGET)
    assert check.violations == 1
    assert check.first_violations[0].wall_s == 1.2


def test_only_the_first_violations_are_listed_but_all_are_counted() -> None:
    rows = [(float(i), 0, 0, BUDGET + 1 + i % 2) for i in range(KEPT_VIOLATIONS + 5)]
    check = check_budget(*events(rows), budget_slots=BUDGET)
    assert check.violations == KEPT_VIOLATIONS + 5
    assert len(check.first_violations) == KEPT_VIOLATIONS


def test_no_events_hold_nothing() -> None:
    check = check_budget(*HeldLog().arrays(), budget_slots=BUDGET)
    assert check.ok
    assert check.events == 0
    assert check.max_held_at_wall_s is None


@pytest.mark.parametrize("seed", range(5))
def test_the_check_agrees_with_a_plain_replay(seed: int) -> None:
    rng = np.random.default_rng(seed)
    count = 400
    times = np.round(rng.uniform(0, 10, count), 1)  # many shared instants
    cells = rng.integers(0, 12, count)
    values = rng.integers(0, 4, count)
    check = check_budget(times, cells, values, budget_slots=14)
    held: dict[int, int] = {}
    totals: dict[float, int] = {}
    for index in sorted(range(count), key=lambda i: (times[i], i)):
        held[int(cells[index])] = int(values[index])
        totals[float(times[index])] = sum(held.values())
    assert check.instants == len(totals)
    assert check.violations == sum(1 for total in totals.values() if total > 14)
    assert check.max_held_slots == max(totals.values())
